"""The audit's result types: one event test and the whole :class:`AuditResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class EventTest:
    """One test: event E (or its complement) with x in the numerator, x' in the denominator."""

    scenario: str
    event: str
    complement: bool  # the event is the complement of the scenario's event
    swapped: bool  # x' of the scenario is in the numerator
    x: str
    x_prime: str
    count_x: int
    count_x_prime: int
    trials: int
    p_x_lower: float
    p_x_prime_upper: float
    epsilon_lower_bound: float
    delta_lower_bound: float
    epsilon_point_estimate: float | None


@dataclass
class AuditResult:
    """The audit's outcome; :meth:`to_json` is what ``hybriddp audit --json`` prints."""

    mechanism: str
    epsilon_claimed: float
    delta: float
    trials: int
    confidence: float
    per_bound_confidence: float
    epsilon_lower_bound: float
    delta_lower_bound: float
    best: EventTest
    tests: list[EventTest]
    details: dict[str, Any]
    seed: int | None
    seconds: float

    @property
    def violation(self) -> bool:
        """True when the audit refutes the claim (ε_lb > ε or δ_lb > δ)."""
        return self.epsilon_lower_bound > self.epsilon_claimed or self.delta_lower_bound > self.delta

    def to_json(self) -> dict[str, Any]:
        b = self.best
        return {
            "mechanism": self.mechanism,
            "epsilon_claimed": self.epsilon_claimed,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "delta": self.delta,
            "delta_lower_bound": self.delta_lower_bound,
            "violation": self.violation,
            "trials": self.trials,
            "confidence": self.confidence,
            "per_bound_confidence": self.per_bound_confidence,
            "method": "one-sided Clopper-Pearson, Bonferroni over all tests; eps_lb = ln((p_x_lower - delta)"
                      "/p_x_prime_upper), delta_lb = p_x_lower - e^eps_claimed * p_x_prime_upper",
            "scenario": b.scenario,
            "event": b.event,
            "x": b.x,
            "x_prime": b.x_prime,
            "count_x": b.count_x,
            "count_x_prime": b.count_x_prime,
            "p_x_lower": b.p_x_lower,
            "p_x_prime_upper": b.p_x_prime_upper,
            "epsilon_point_estimate": b.epsilon_point_estimate,
            "tests": [asdict(t) for t in self.tests],
            "details": self.details,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
        }
