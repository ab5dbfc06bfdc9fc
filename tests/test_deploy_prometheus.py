"""deploy/prometheus/: the alert rules parse as PromQL and name only metrics ASO exports with
labels it sets; the scrape configuration reads the file `aso metrics targets` writes; the
timer's units pass `systemd-analyze verify`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY

import aso.metrics  # noqa: F401 - registers ASO's metrics

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
RULES = yaml.safe_load((DEPLOY / "aso-alerts.yml").read_text())
ALL_RULES = [rule for group in RULES["groups"] for rule in group["rules"]]
# Metrics Prometheus itself makes (not ASO's).
PROMETHEUS_OWN = {"up"}


def exported() -> dict[str, set[str]]:
    """Every sample name ASO's metrics produce (with _total, _bucket, ...), with its labels."""
    names: dict[str, set[str]] = {}
    for collector in list(REGISTRY._collector_to_names):
        for family in collector.describe() if hasattr(collector, "describe") else []:
            if not family.name.startswith("aso_"):
                continue
            labels = set(getattr(collector, "_labelnames", ()))
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",),
            }[family.type]
            for suffix in suffixes:
                extra = {"le"} if suffix == "_bucket" else set()
                names[family.name + suffix] = labels | extra
    return names


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it matches on) of every selector of a PromQL expression."""
    found: list[tuple[str, set[str]]] = []

    def visit(node) -> None:  # promql_parser's AST: walk the attributes that hold expressions
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers} if node.matchers else set()
            found.append((node.name, labels))
        for attribute in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attribute, None)
            if isinstance(child, promql_parser.Expr):
                visit(child)
        for child in getattr(node, "args", None) or []:
            visit(child)

    visit(promql_parser.parse(expr))
    return found


def test_every_rule_is_complete():
    assert len(ALL_RULES) >= 10
    for rule in ALL_RULES:
        assert re.fullmatch(r"ASO[A-Za-z]+", rule["alert"]), rule
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r["alert"] for r in ALL_RULES])
def test_rule_names_metrics_and_labels_aso_exports(rule):
    names = exported()
    used = selectors(rule["expr"])  # raises ValueError on a syntax error
    # the walk misses no selector: every metric-like word of the text is among those it found
    words = set(re.findall(r"\b(aso_\w+|up)\b(?=\s*[{\[)])", rule["expr"]))
    assert used and words <= {name for name, _ in used}, rule["expr"]
    for name, labels in used:
        if name in PROMETHEUS_OWN:
            continue
        assert name in names, f"{rule['alert']}: ASO exports no {name}"
        # job/instance come from the scrape; agent/aso_instance from `aso metrics targets`
        assert labels <= names[name] | {"job", "instance", "agent", "aso_instance"}, (
            rule["alert"],
            name,
            labels - names[name],
        )
    # Every label a rule's text quotes is one the expression can carry.
    quoted = set(re.findall(r"\$labels\.(\w+)", str(rule["annotations"])))
    grouped = set(re.findall(r"by \(([^)]*)\)", rule["expr"]))
    carried = {label.strip() for group in grouped for label in group.split(",")}
    if not grouped:
        carried = set().union(*(names.get(n, set()) for n, _ in used)) | {"agent", "aso_instance"}
    assert quoted <= carried, (rule["alert"], quoted - carried)


def test_a_syntax_error_is_caught():
    with pytest.raises(ValueError):
        selectors("sum by (agent (rate(aso_agent_cycles_total[5m]))")


def test_scrape_configuration_reads_the_targets_file_and_the_rules():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    files = jobs["aso-agents"]["file_sd_configs"][0]["files"]
    timer = (DEPLOY / "aso-metrics-targets.service").read_text()
    assert f"--out {files[0]}" in timer  # the timer writes what Prometheus reads
    assert any(path.endswith("aso-alerts.yml") for path in config["rule_files"])
    assert all(":9399" in t for t in jobs["aso-frontend"]["static_configs"][0]["targets"])


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_targets_timer_units_verify(tmp_path):
    prefix = str(Path(sys.executable).parent.parent.parent)  # the checkout holding .venv
    for name in ("aso-metrics-targets.service", "aso-metrics-targets.timer"):
        text = (DEPLOY / name).read_text().replace("/opt/aso", prefix)
        (tmp_path / name).write_text(text.replace("User=aso", "User=root"))
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(p) for p in sorted(tmp_path.iterdir()))],
        capture_output=True,
        text=True,
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "aso-metrics-targets" in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr
