"""The Prometheus text format (0.0.4) and OpenMetrics 1.0.0, written by the daemon itself.

prometheus_client's exposition (`prometheus_client/exposition.py`) imports `http.server`,
`urllib.request` and through them `http.client`, `ssl` (OpenSSL's libssl and libcrypto) and
`email`: about 7 MiB of a daemon's RSS for a few kilobytes of text. The formats are small and
fixed (https://prometheus.io/docs/instrumenting/exposition_formats/ and the OpenMetrics 1.0
spec), so the daemon writes them here, byte for byte as prometheus_client 0.26's
`generate_latest` and `openmetrics.exposition.generate_latest` do for the same families
(tests/test_exposition.py holds them to it, and parses the text with prometheus_client's
parser; prometheus_client stays a test dependency as that oracle).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Sample:
    """One line of a family: its full name (with `_total`, `_bucket`...), labels and value
    (the fields of prometheus_client's Sample that the daemon uses)."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    """One metric: `name` as OpenMetrics names it (a counter without `_total`), its type
    ("gauge", "counter" or "histogram"), help text, label names and samples."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    samples: list[Sample] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, mtype: str, help_text: str, labels: Sequence[str] = ()) -> Family:
        """A family for an exposed name: a counter's `_total` is the sample's, not the name's
        (as prometheus_client's CounterMetricFamily strips it)."""
        if mtype == "counter" and name.endswith("_total"):
            name = name[: -len("_total")]
        return cls(name, mtype, help_text, tuple(labels))

    def add(self, values: Sequence[str], value: float) -> None:
        """One gauge or counter series with these label values."""
        suffix = "_total" if self.type == "counter" else ""
        self.samples.append(Sample(self.name + suffix, self._labels(values), float(value)))

    def add_histogram(
        self, values: Sequence[str], buckets: Sequence[tuple[str, float]], sum_value: float
    ) -> None:
        """Cumulative `buckets` (upper bound text, count), the last one `+Inf`; then
        `_count` (the `+Inf` count) and `_sum`, in prometheus_client's order."""
        labels = self._labels(values)
        for bound, count in buckets:
            self.samples.append(Sample(self.name + "_bucket", {**labels, "le": bound}, count))
        self.samples.append(Sample(self.name + "_count", labels, float(buckets[-1][1])))
        self.samples.append(Sample(self.name + "_sum", labels, float(sum_value)))

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: {len(values)} label values for {self.labels}")
        return dict(zip(self.labels, (str(v) for v in values), strict=True))


def go_float(value: float) -> str:
    """A value as Go (and so Prometheus, and prometheus_client's floatToGoString) writes it:
    +Inf, -Inf, NaN, and an exponent once a positive number has 7 or more integer digits."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _label_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(sample: Sample) -> str:
    labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(sample.labels.items()))
    braced = "{" + labels + "}" if labels else ""
    return f"{sample.name}{braced} {go_float(sample.value)}\n"


def render_text(families: Iterable[Family]) -> bytes:
    """The Prometheus text format 0.0.4: a counter's HELP and TYPE name carry `_total`."""
    out: list[str] = []
    for fam in families:
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        help_text = fam.help.replace("\\", r"\\").replace("\n", r"\n")
        out += (f"# HELP {name} {help_text}\n", f"# TYPE {name} {fam.type}\n")
        out += (_line(s) for s in fam.samples)
    return "".join(out).encode("utf-8")


def render_openmetrics(families: Iterable[Family]) -> bytes:
    """OpenMetrics 1.0.0: the family name without `_total`, HELP escaped like a label value,
    and `# EOF` at the end."""
    out: list[str] = []
    for fam in families:
        out += (f"# HELP {fam.name} {_label_value(fam.help)}\n", f"# TYPE {fam.name} {fam.type}\n")
        out += (_line(s) for s in fam.samples)
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def wants_openmetrics(accept: str) -> bool:
    """Does the Accept header take OpenMetrics 1.x (Prometheus >= 2.5 asks for it first)? A
    type without a version counts; `version=0.0.1` (the pre-1.0 draft) does not, as in
    prometheus_client's choose_encoder. Everything else gets the text format 0.0.4."""
    for accepted in accept.split(","):
        kind, *params = (p.strip() for p in accepted.split(";"))
        if kind != "application/openmetrics-text":
            continue
        version = next((p.split("=", 1)[1] for p in params if p.startswith("version=")), "")
        if not version or _major(version) >= 1:
            return True
    return False


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0
