"""RolloutPipe's pipeline policy: pure Python, shared by the real trainer and the simulator.

Imports nothing from verl, vllm, ray or torch (a test checks it); matplotlib is loaded only to draw a Gantt chart.
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
from .modes import TRAIN_UNITS, TRAINER_MODES, WHOLE_STEP_UNITS, FgdStrength, Mode
from .round import Round, RoundShape
from .timeline import PREFIX, RoundTimeline, TrainerInterval, plot_gantt

__all__ = [
    "PREFIX",
    "TRAINER_MODES",
    "TRAIN_UNITS",
    "WHOLE_STEP_UNITS",
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
    "RoundShape",
    "RoundTimeline",
    "TrainerInterval",
    "dispatch_mode_of",
    "trains_after_first_step",
    "engine_frontier_width",
    "make_admission",
    "plot_gantt",
    "resolve_frontier_width",
]
