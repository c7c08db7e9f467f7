"""RolloutPipe's pipeline policy: pure Python, shared by the real trainer and the simulator.

Imports nothing from verl, vllm, ray, torch or matplotlib (a test checks it); drawing a timeline is
``recipe.rolloutpipe.drawing``'s job.
"""

from .clock import Clock, ManualClock, MonotonicClock
from .fifo import CompleteGroupFIFO, Dispatch, DispatchMode, dispatch_mode_of, trains_after_first_step
from .frontier import (
    AdaptiveFrontierAdmission,
    Admission,
    AdmissionPolicy,
    FifoAdmission,
    FrontierAdmission,
    MeasuredFrontierWidth,
    engine_frontier_width,
    make_admission,
    resolve_frontier_width,
)
from .ledger import (
    GroupLedger,
    GroupRecord,
    GroupState,
    PipelineInvariantError,
    PipelineStallError,
    RoundAbortedError,
)
from .modes import TRAINER_MODES, FgdStrength, Mode, TrainUnit
from .round import Round
from .settings import RoundSettings, resolve_round_settings
from .timeline import PREFIX, RoundTimeline, TrainerInterval

__all__ = [
    "PREFIX",
    "TRAINER_MODES",
    "AdaptiveFrontierAdmission",
    "Admission",
    "AdmissionPolicy",
    "Clock",
    "CompleteGroupFIFO",
    "Dispatch",
    "DispatchMode",
    "FgdStrength",
    "FifoAdmission",
    "FrontierAdmission",
    "MeasuredFrontierWidth",
    "GroupLedger",
    "GroupRecord",
    "GroupState",
    "ManualClock",
    "Mode",
    "MonotonicClock",
    "PipelineInvariantError",
    "PipelineStallError",
    "Round",
    "RoundAbortedError",
    "RoundSettings",
    "TrainUnit",
    "RoundTimeline",
    "TrainerInterval",
    "dispatch_mode_of",
    "trains_after_first_step",
    "engine_frontier_width",
    "make_admission",
    "resolve_frontier_width",
    "resolve_round_settings",
]
