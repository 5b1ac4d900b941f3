"""Hypothesis settings profiles for the property tests (`make stress`; docs/testing.md, "Stress run").

``HYPOTHESIS_PROFILE`` picks one; unset (``make test``) is Hypothesis's own default profile, unchanged. ``stress``
runs every property with :data:`STRESS_EXAMPLES` examples: a property without its own ``max_examples`` takes it
from the profile, and one that pins its own count (the core's, to keep ``make test`` fast) asks
:func:`examples` for it. The stress profile prints the reproduction blob of a failure, and keeps the example
database: a case it finds is replayed by the next ordinary run until it is fixed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

__all__ = ["PROFILE_ENV", "STRESS", "STRESS_EXAMPLES", "examples", "load_profile", "scaled_timeout_s"]

PROFILE_ENV = "HYPOTHESIS_PROFILE"
STRESS = "stress"
STRESS_EXAMPLES = 1500

settings.register_profile(
    STRESS,
    max_examples=STRESS_EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def load_profile(environ: Mapping[str, str] = os.environ) -> str:
    """Load the profile ``HYPOTHESIS_PROFILE`` names (unset: ``default``); an unknown name is an error."""
    name = environ.get(PROFILE_ENV) or "default"
    settings.load_profile(name)  # raises InvalidArgument naming the profile when it is not registered
    return name


def examples(pinned: int) -> int:
    """The ``max_examples`` of a property that pins its own count: ``pinned`` normally, the stress profile's
    (never fewer than ``pinned``) while ``HYPOTHESIS_PROFILE=stress``."""
    if os.environ.get(PROFILE_ENV) == STRESS:
        return max(pinned, settings.get_profile(STRESS).max_examples)
    return pinned


def scaled_timeout_s(timeout_s: float, pinned: int) -> float:
    """A property's ``pytest.mark.timeout`` for :func:`examples`: ``timeout_s`` normally, scaled by the examples'
    ratio under the stress profile (a timeout marker overrides pytest's command line, so it must scale itself)."""
    return timeout_s * examples(pinned) / pinned
