"""deploy/grafana: the dashboard queries only series Treadle exports, and compose loads it.

Grafana is not run here (Docker may be absent): the dashboard JSON is checked for the
fields Grafana's file provisioning needs, every PromQL expression for the metric names it
uses (read from prometheus_client's registry after importing ``app.core.metrics``), and,
when ``promtool`` is installed, for PromQL syntax. The provisioning files are checked
against docker-compose.yml's mounts and the prometheus service.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import app.core.metrics  # noqa: F401 - registers every Treadle metric

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD_FILE = GRAFANA / "dashboards" / "treadle.json"
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())

# Grafana's own variables, replaced by values for the PromQL checks: what Grafana would
# substitute ($__rate_interval is a range, $workflow a regex of the multi-value variable).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$workflow": ".*"}
METRIC = re.compile(r"\btreadle_[a-z_]+\b")
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap"}


def load_dashboard(path: Path = DASHBOARD_FILE) -> dict[str, Any]:
    """The dashboard JSON, parsed."""
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def exported_series() -> set[str]:
    """Every series name Treadle's metrics expose, histogram and counter suffixes included."""
    names: set[str] = set()
    for metric in REGISTRY.collect():
        if not metric.name.startswith("treadle_"):
            continue
        names.add(metric.name)
        names.update(sample.name for sample in metric.samples)
        if metric.type == "histogram":
            names.update(f"{metric.name}_{s}" for s in ("bucket", "sum", "count"))
        if metric.type == "counter":
            names.add(f"{metric.name}_total")
    return names


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that query (rows excluded), nested rows' panels included."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the query variables."""
    exprs = [t["expr"] for p in query_panels(dashboard) for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def as_promql(expr: str) -> str:
    """``expr`` with Grafana's variables replaced, so it is plain PromQL."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def test_every_query_names_a_series_treadle_exports() -> None:
    exported = exported_series()
    used = {name for expr in expressions(load_dashboard()) for name in METRIC.findall(expr)}
    assert used <= exported, f"the dashboard uses series nobody exports: {sorted(used - exported)}"


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    """Throughput, step latency percentiles, queue and schedule-to-start, leases, dead letters."""
    exprs = expressions(load_dashboard())
    text = "\n".join(exprs)
    for series in (
        "treadle_runs_submitted_total",
        "treadle_runs_finished_total",
        "treadle_step_duration_seconds_bucket",
        "treadle_runs",
        "treadle_schedule_to_start_seconds_bucket",
        "treadle_lease_losses_total",
        "treadle_dead_letters_pending",
        "treadle_worker_slots",
    ):
        assert re.search(rf"\b{series}\b", text), f"no panel shows {series}"
    latency = [e for e in exprs if "treadle_step_duration_seconds_bucket" in e]
    quantiles = {m for e in latency for m in re.findall(r"histogram_quantile\((0\.\d+)", e)}
    assert {"0.5", "0.95", "0.99"} <= quantiles, quantiles
    # Throughput is by workflow: the workflow label is kept.
    throughput = [e for e in exprs if "treadle_runs_finished_total" in e]
    assert any("by (workflow" in e for e in throughput), throughput


def test_the_dashboard_has_the_structure_grafana_requires() -> None:
    dashboard = load_dashboard()
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"]), dashboard["uid"]
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    ids += [n["id"] for p in dashboard["panels"] for n in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = query_panels(dashboard)
    assert len(panels) >= 8
    for panel in panels:
        where = f"panel {panel.get('id')} {panel.get('title')!r}"
        assert panel["type"] in PANEL_TYPES, where
        assert panel["title"], where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid) and grid["x"] + grid["w"] <= 24, where
        assert panel["targets"], f"{where} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target["expr"].strip(), where
            assert target["datasource"] == panel["datasource"], where


def test_grafanas_variables_are_the_known_ones() -> None:
    for expr in expressions(load_dashboard()):
        as_promql(expr)  # raises on a variable the checks cannot substitute


def test_a_query_naming_an_unknown_series_is_caught(tmp_path: Path) -> None:
    """The name check can fail: a typo in a metric name is reported by name."""
    broken = load_dashboard()
    query_panels(broken)[0]["targets"][0]["expr"] = "rate(treadle_runs_submited_total[5m])"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    used = {n for e in expressions(load_dashboard(path)) for n in METRIC.findall(e)}
    assert used - exported_series() == {"treadle_runs_submited_total"}


def test_compose_provisions_grafana_with_the_dashboard() -> None:
    grafana = COMPOSE["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"] if v.startswith("./")}
    for local in mounts:
        assert (ROOT / local).is_dir(), local
    assert mounts["./deploy/grafana/provisioning/datasources"] == (
        "/etc/grafana/provisioning/datasources"
    )
    assert mounts["./deploy/grafana/provisioning/dashboards"] == (
        "/etc/grafana/provisioning/dashboards"
    )
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/treadle.yml").read_text())
    (files,) = provider["providers"]
    assert files["type"] == "file"
    assert mounts["./deploy/grafana/dashboards"] == files["options"]["path"]
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (prometheus,) = datasources["datasources"]
    assert prometheus["type"] == "prometheus" and prometheus["isDefault"] is True
    # The URL is the compose prometheus service on the port its image listens on.
    assert prometheus["url"] == "http://prometheus:9090"
    assert "prometheus" in COMPOSE["services"] and "prometheus" in grafana["depends_on"]
    assert all(p.startswith("127.0.0.1:") for p in grafana["ports"]), "published locally only"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{files['options']['path']}/{DASHBOARD_FILE.name}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_parses_every_expression(tmp_path: Path) -> None:
    """Each expression as a recording rule: ``promtool check rules`` parses its PromQL."""
    promtool = shutil.which("promtool")
    assert promtool is not None
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": as_promql(expr)}
                    for i, expr in enumerate(expressions(load_dashboard()))
                    # label_values() is Grafana's variable query, not PromQL.
                    if not expr.startswith("label_values(")
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # And promtool does fail on broken PromQL, so the pass above means something.
    path.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by ("}]}]}
        )
    )
    broken = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert broken.returncode != 0
