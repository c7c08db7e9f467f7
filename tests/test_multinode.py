"""``trainer.nnodes=2`` through Ray: a two-node Ray cluster on this machine (Ray's own ``ray.cluster_utils.Cluster``:
two raylets, one logical device each), the recipe launched against it with ``RAY_ADDRESS`` as on a real cluster.
verl places one trainer placement group per node, so the two FSDP2 ranks (gloo) run on different Ray nodes; the
on-policy equivalence check then runs with data parallelism 2 across them."""

from __future__ import annotations

import pytest
from ray.cluster_utils import Cluster


@pytest.mark.real_stack(runs=1)
def test_streaming_round_on_two_ray_nodes_equals_the_serial_round(tmp_path, verify_onpolicy):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "num_gpus": 1})
    cluster.add_node(num_cpus=8, num_gpus=1)
    try:
        # train_unit=groups: single groups split over the two ranks, the token-mean divisor all-reduced across them;
        # with verl's KL loss to the reference policy (the one real-stack exactness check of groups + KL: a launch
        # is ~2 min of the suite, so this one carries both)
        v, log = verify_onpolicy(tmp_path, "groups", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                                 "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.5",
                                 "actor_rollout_ref.actor.kl_loss_type=kl", ray_address=cluster.address)
    finally:
        cluster.shutdown()
    assert v["kl_loss"]
    assert "[rolloutpipe] trainer pool: 2 FSDP rank(s) on 2 Ray node(s)" in log, log[-3000:]
