"""Everything the watchdog knows about engines and hangs, loaded once and passed down.

The daemon's wiring, `replay` and `preflight` each build one `Knowledge` at start (shipped data
plus the operator's `--signatures` / `--engines` files) and hand its parts to what needs them:
no module reads knowledge on import or behind a cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from watchdog.core.openops import OpDef
from watchdog.core.ranks import RankRules
from watchdog.core.signatures import SignatureSet, load_signatures
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

    @property
    def ops(self) -> tuple[OpDef, ...]:
        return self.signatures.ops

    @property
    def ranks(self) -> RankRules:
        return self.signatures.ranks

    @classmethod
    def of(cls, signatures: SignatureSet, engines: EngineSet) -> Knowledge:
        """The bundle for already loaded signatures and engines (package lists derived)."""
        return cls(signatures, engines, packages_for(engines), modules_for(engines))


def load_knowledge(
    signatures: Sequence[Path | str] = (), engines: Sequence[Path | str] = ()
) -> Knowledge:
    """The shipped knowledge plus the operator's files, merged as `load_signatures` and
    `load_engines` merge them; SignatureError or EngineError (naming file, entry and key)."""
    return Knowledge.of(load_signatures(signatures), load_engines(engines))
