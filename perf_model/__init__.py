"""perf_model: engine step time learned from live FPM samples, bootstrapped from a measured profile.

- :mod:`perf_model.step_timer`: :class:`ProfileStepTimer`, step time calibrated on a measured profile
  (the fleet simulator's engine clock).
- :mod:`perf_model.profile`: reading a measured-profile directory.
- :mod:`perf_model.api`: the :class:`PerfPredictor` protocol the decision core codes against.
- :mod:`perf_model.model`: :class:`~perf_model.model.PerfModel`, the online model (import it from there: it
  pulls in scikit-learn, which the simulator's engine clock does not need).
"""

from __future__ import annotations

from perf_model.api import LatencyEstimate, PerfPredictor, StepPredictor
from perf_model.errors import InvalidLoadError, ModelNotReadyError, ProfileError
from perf_model.profile import DecodePoint, MeasuredProfile, PrefillPoint, load_profile
from perf_model.step_timer import ProfileStepTimer, StepTimerParams

__all__ = [
    "DecodePoint",
    "InvalidLoadError",
    "LatencyEstimate",
    "MeasuredProfile",
    "ModelNotReadyError",
    "PerfPredictor",
    "PrefillPoint",
    "ProfileError",
    "ProfileStepTimer",
    "StepPredictor",
    "StepTimerParams",
    "load_profile",
]
