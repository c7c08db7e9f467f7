"""Side-by-side benchmark: sync vs CGP vs CGP+FGD on long-tail response-length workloads (``python -m
recipe.rolloutpipe.bench``). ``workloads``/``report``/``pinning`` are pure Python; ``runner``/``agent_loop`` touch
verl."""
