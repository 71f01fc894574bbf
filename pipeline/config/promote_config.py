"""`promote`: the promotion gate's floors and the registered model names."""

from __future__ import annotations

from pydantic import Field, StrictBool

from pipeline.config.base import DomainName
from pipeline.config.section import Section, cross_check


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

    def gate(self, domain: str) -> DomainGate:
        return self.gates.get(domain, self.default_gate)


@cross_check("corpus", "promote")
def _gates_have_sources(params) -> None:
    """A gate for a domain no source gives could never pass (its metrics never exist): said now, not
    as a missing metric at promote."""
    domains = params.corpus.domains()
    for domain in params.promote.gates if domains is not None else ():
        if domain not in domains:
            raise ValueError(f"promote.gates.{domain}: no corpus source has domain '{domain}' "
                             f"(the sources give {sorted(domains)}); remove the gate or add a source")
