"""Broken and healthy hosts as Prometheus sees them, for the alerting rules' tests
(tests/test_prometheus_alerts.py): each host is a list of real reconcile outputs (the textfile
a real `diff --textfile` or a real Watcher pass wrote) placed on a model timeline, turned into
`promtool test rules` input series. Nothing here is typed: names, labels and values are the
ones reconcile wrote; only the timestamps are moved onto promtool's clock, which starts at 0.

Between two runs the file keeps its last content, as node_exporter serves it; a host that
stops writing (a stuck watch) keeps its last file; a host "gone" (textfile deleted,
node_exporter stopped) has no samples from then on."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

STEP = 60  # seconds between input samples (promtool's `interval: 1m`)


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition text through prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def written_at(samples: list[tuple[str, dict[str, str], float]]) -> float:
    """When reconcile wrote the file: the watch's pass end, else the run's attempt end."""
    by_name = {name: v for name, labels, v in samples if not labels}
    for name in ("reconcile_watch_last_pass_timestamp_seconds", "reconcile_last_attempt_timestamp_seconds"):
        if name in by_name:
            return by_name[name]
    raise AssertionError("no write time in the textfile")


@dataclass
class Scene:
    """One host: its runs (model time in seconds, the textfile written then), and when it went away."""

    instance: str
    runs: list[tuple[float, str]] = field(default_factory=list)
    gone_at: float | None = None
    textfile: str = "/var/lib/prometheus/node-exporter/reconcile.prom"

    def run(self, at: float, text: str) -> Scene:
        self.runs.append((at, text))
        return self

    def latest(self, t: float) -> tuple[float, list] | None:
        if self.gone_at is not None and t >= self.gone_at:
            return None
        done = [(at, text) for at, text in self.runs if at <= t]
        return (done[-1][0], parse(done[-1][1])) if done else None

    def series(self, steps: int) -> dict[str, list[str]]:
        """`promtool` input series of this host: selector -> one value (or `_`) per step."""
        out: dict[str, list[str]] = {}
        for step in range(steps + 1):
            t = step * STEP
            seen = self.latest(t)
            present: dict[str, str] = {}
            if seen is not None:
                at, samples = seen
                wrote = written_at(samples)
                for name, labels, value in samples:
                    if name.endswith("_timestamp_seconds") and value > 1e9:
                        value = at + (value - wrote)  # the same offset from the write, on promtool's clock
                    present[selector(name, {**labels, "instance": self.instance, "job": "node"})] = f"{value:g}" \
                        if abs(value) < 1e15 else repr(value)
                # node_exporter's own series for the file: its modification time is the write.
                present[selector("node_textfile_mtime_seconds", {"file": self.textfile, "instance": self.instance,
                                                                  "job": "node"})] = f"{at:g}"
            for key in present.keys() | out.keys():
                out.setdefault(key, ["_"] * step).append(present.get(key, "_"))
        return out


def selector(name: str, labels: dict[str, str]) -> str:
    body = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                    for k, v in sorted(labels.items()))
    return f"{name}{{{body}}}"


def watch_runs(state: Path, passes: int, interval: float, between=None) -> list[tuple[float, str]]:
    """A real Watcher (what `reconcile watch --textfile` runs) for `passes` passes, with the
    textfile sink the CLI hands it: each pass's file, at the model time the watch's own
    delays (its back-off included) put it. `between(i)` runs after pass i (change the state)."""
    import tempfile

    from reconcile_host.doors.sinks.textfile import Textfile
    from reconcile_host.pipeline.watch import Watcher

    textdir = Path(tempfile.mkdtemp(prefix="promscene", dir=state.parent))
    texts: list[str] = []

    def wait(_delay: float) -> None:
        texts.append((textdir / "reconcile.prom").read_text())
        if between:
            between(len(texts))

    watcher = Watcher(str(state), interval, None, None, log=io.StringIO(), max_passes=passes, wait=wait,
                      on_pass=Textfile(textdir, interval, watch=True).take)
    assert watcher.run() == 0
    texts.append((textdir / "reconcile.prom").read_text())
    times = [0.0]
    for delay in watcher.delays:
        times.append(times[-1] + delay)
    return list(zip(times, texts, strict=True))


def promtool_file(rules: Path, scenes: list[Scene], steps: int, checks: list[dict]) -> dict:
    """The `promtool test rules` document: every scene's series, and alert_rule_test `checks`."""
    input_series = []
    for scene in scenes:
        for sel, values in sorted(scene.series(steps).items()):
            input_series.append({"series": sel, "values": " ".join(values)})
    return {"rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": input_series, "alert_rule_test": checks}]}
