"""Probe starvation: a /health that fails only while our own /metrics scrape runs is something we
caused, not a hang.

SGLang renders /metrics inline on the event loop that also answers /health, so a slow scrape
holds the health check until it is done (sgl-project/sglang#28157; the fix, #28163, was still
open when this was written). The watchdog probes the two on separate connections and threads,
each under its own deadline; when /health fails while our scrape is still in flight, that
answer is held back and the next tick probes /health alone. If it then answers, the failure was
ours (`probe_starvation`): it is recorded as a note on the observation, never as a failing
health check, and the scrape backs off (every 2nd, 4th, ... tick, bounded). If /health fails
alone too, it is a real failure and counts from then on.
"""

from __future__ import annotations

from dataclasses import dataclass

# The scrape is taken at most every MAX_SCRAPE_EVERY ticks while backing off (~8 s at the
# default 1 s tick): progress counters read that late still beat any stall_after_s.
MAX_SCRAPE_EVERY = 8
# Clean scrapes (health answered while the scrape ran) before the back-off is halved.
CLEAN_TO_RECOVER = 4


@dataclass
class StarvationJudge:
    """Decides, per tick, whether to scrape /metrics and whether a failed /health was ours."""

    scrape_every: int = 1  # scrape on one tick in this many
    starved: int = 0  # confirmed episodes, for the log and tests
    _suspect: bool = False  # the last health failure overlapped our scrape: probe it alone
    _since_scrape: int = 0
    _clean: int = 0

    def scrape_now(self) -> bool:
        """Whether this tick scrapes /metrics (never while a suspect is being checked)."""
        if self._suspect:
            return False
        self._since_scrape += 1
        if self._since_scrape >= self.scrape_every:
            self._since_scrape = 0
            return True
        return False

    def judge(self, health_failed: bool, overlapped: bool, scraped: bool) -> str:
        """'suspect' (hold this failure back: it overlapped our scrape), 'starved' (the failure
        was ours: /health answered alone), or 'report' (count this answer as it is)."""
        if self._suspect and not scraped:
            self._suspect = False
            if health_failed:
                return "report"  # it fails alone too: a real failure
            self.starved += 1
            self.scrape_every = min(max(2, self.scrape_every * 2), MAX_SCRAPE_EVERY)
            self._since_scrape = 0
            self._clean = 0
            return "starved"
        if health_failed and overlapped and scraped:
            self._suspect = True
            return "suspect"
        if scraped and not health_failed and self.scrape_every > 1:
            self._clean += 1
            if self._clean >= CLEAN_TO_RECOVER:
                self.scrape_every = max(1, self.scrape_every // 2)
                self._clean = 0
        return "report"

    @property
    def backing_off(self) -> bool:
        return self.scrape_every > 1
