"""Everything the watchdog knows about engines and hangs, loaded once and passed down.

The daemon's wiring, `replay` and `preflight` each build one `Knowledge` at start (shipped data
plus the operator's `--signatures` / `--engines` files) and hand its parts to what needs them:
no module reads knowledge on import or behind a cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.core.knowledge.opdefs import OpDef
from watchdog.core.knowledge.published import Published, load_published
from watchdog.core.knowledge.rankrules import RankRules
from watchdog.core.knowledge.signatures import SignatureSet, load_signatures
from watchdog.engines.loader import EngineSet, load_engines
from watchdog.sources.pyenv import modules_for, packages_for


@dataclass(frozen=True)
class Knowledge:
    """Signatures (with the operation table and rank rules the classifier reads), engine
    profiles, and the distributions whose versions are read from the server's environment."""

    signatures: SignatureSet
    engines: EngineSet
    packages: tuple[str, ...]  # every profile's distributions, then FlashInfer's and torch's
    modules: tuple[str, ...]  # engines' import packages, for a renamed distribution
    # The registry's published versions and the commands fix lines may name (published.toml);
    # empty when a bundle is built without it (nothing is then checked against it).
    published: Published = field(default_factory=Published)

    @property
    def ops(self) -> tuple[OpDef, ...]:
        return self.signatures.ops

    @property
    def ranks(self) -> RankRules:
        return self.signatures.ranks

    @classmethod
    def of(
        cls, signatures: SignatureSet, engines: EngineSet, published: Published | None = None
    ) -> Knowledge:
        """The bundle for already loaded signatures and engines (package lists derived)."""
        pub = published if published is not None else Published()
        return cls(signatures, engines, packages_for(engines), modules_for(engines), pub)


def load_knowledge(
    signatures: Sequence[Path | str] = (), engines: Sequence[Path | str] = ()
) -> Knowledge:
    """The shipped knowledge plus the operator's files, merged as `load_signatures` and
    `load_engines` merge them, with the shipped published-versions record; SignatureError or
    EngineError (naming file, entry and key)."""
    return Knowledge.of(load_signatures(signatures), load_engines(engines), load_published())
