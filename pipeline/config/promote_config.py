"""`promote`: the promotion gate's floors, the temperatures it decides at, and the registered model names."""

from __future__ import annotations

from pydantic import Field, StrictBool, field_validator

from pipeline.config.base import DomainName
from pipeline.config.evaluate_config import temperature_key
from pipeline.config.section import Section, cross_check, unique


class DomainGate(Section):
    min_tau: float = Field(1.0, ge=0)
    min_speedup: float = Field(0.0, ge=0)


class PromoteConfig(Section):
    model_name_prefix: str = "draftline"
    require_lossless: StrictBool = True
    max_regression: float = Field(0.05, ge=0, le=1)
    default_gate: DomainGate = DomainGate(min_tau=1.2, min_speedup=1.0)
    gates: dict[DomainName, DomainGate] = Field(
        default_factory=dict, description="floors for the named domains; every other domain gets default_gate",
    )
    temperatures: list[float] | None = Field(
        None, min_length=1, description="the sampling temperatures a drafter must pay at: every domain's floors "
        "apply at each; unset: every temperature evaluate runs ([0.0] for a greedy-only deployment)",
    )

    @field_validator("temperatures")
    @classmethod
    def _unique_temperatures(cls, value: list[float] | None) -> list[float] | None:
        return value if value is None else unique(value, "temperatures")

    def gate(self, domain: str) -> DomainGate:
        return self.gates.get(domain, self.default_gate)

    def gated_temperatures(self, evaluated: list[float]) -> list[str]:
        """The temperatures the gate decides at, as eval.json keys them: those listed, else every evaluated one."""
        return [temperature_key(temperature) for temperature in
                (evaluated if self.temperatures is None else self.temperatures)]


@cross_check("corpus", "promote")
def _gates_have_sources(params) -> None:
    """A gate for a domain no source gives could never pass (its metrics never exist): said now, not
    as a missing metric at promote."""
    domains = params.corpus.domains()
    for domain in params.promote.gates if domains is not None else ():
        if domain not in domains:
            raise ValueError(f"promote.gates.{domain}: no corpus source has domain '{domain}' "
                             f"(the sources give {sorted(domains)}); remove the gate or add a source")


@cross_check("evaluate", "promote")
def _gated_temperatures_are_evaluated(params) -> None:
    """A temperature evaluate never runs has no metrics: said now, not as missing metrics at promote."""
    evaluated = {temperature_key(temperature) for temperature in params.evaluate.temperatures}
    for temperature in params.promote.temperatures or ():
        if temperature_key(temperature) not in evaluated:
            raise ValueError(f"promote.temperatures: {temperature} is not a temperature evaluate runs "
                             f"(evaluate.temperatures: {params.evaluate.temperatures}); add it to "
                             "evaluate.temperatures or remove it from promote.temperatures")
