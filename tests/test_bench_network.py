"""scripts/bench_network.py's own logic, without a network: the topologies every implementation
gets, the ratios and the goals' verdicts, and that ``--help`` documents every flag. (Its figures
come from running it; nothing here is timed.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import deque
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location("bench_network", SCRIPTS / "bench_network.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def connected(pairs: list[tuple[int, int]], nodes: int) -> bool:
    links: dict[int, set[int]] = {i: set() for i in range(nodes)}
    for i, j in pairs:
        links[i].add(j)
        links[j].add(i)
    seen, todo = {0}, deque([0])
    while todo:
        for n in links[todo.popleft()] - seen:
            seen.add(n)
            todo.append(n)
    return len(seen) == nodes


@pytest.mark.parametrize("nodes", [6, 10, 16, 30])
def test_sparse_gives_every_node_four_neighbours_in_one_connected_network(
    bench: ModuleType, nodes: int
) -> None:
    pairs = bench.edges("sparse", nodes)
    assert all(i != j for i, j in pairs) and len(set(map(frozenset, pairs))) == len(pairs)
    assert bench.neighbours(pairs, nodes) == [4] * nodes
    assert connected(pairs, nodes)


@pytest.mark.parametrize("nodes", [2, 5, 10])
def test_mesh_dials_every_earlier_node(bench: ModuleType, nodes: int) -> None:
    pairs = bench.edges("mesh", nodes)
    assert sorted(pairs) == sorted((i, j) for i in range(nodes) for j in range(i))
    assert bench.neighbours(pairs, nodes) == [nodes - 1] * nodes
    assert bench.edges("sparse", min(nodes, 5)) == bench.edges("mesh", min(nodes, 5))


def case(impl: str, p99: float, loss: float = 0.0, rate: float = 20.0) -> dict[str, object]:
    return {
        "impl": impl,
        "topology": "sparse",
        "nodes": 10,
        "rate": rate,
        "delivered": 1,
        "p99_ms": p99,
        "loss": loss,
        "cpu_ms_per_message": p99 / 10,
    }


def test_goals_hold_only_when_measured_and_met(bench: ModuleType) -> None:
    results = [case("companion", 30.0), case("js", 20.0), case("bare", 15.0)]
    rows = bench.ratios(results)
    assert rows[0]["p99_vs_js"] == pytest.approx(1.5) and rows[0]["cpu_vs_bare"] == pytest.approx(2.0)
    goals = bench.goals(results, rows)
    assert goals["no_loss_10_nodes_20_msg_s"] is True and goals["p99_within_2x_js"] is True

    slow = [case("companion", 50.0, loss=0.01), case("js", 20.0)]
    goals = bench.goals(slow, bench.ratios(slow))
    assert goals["no_loss_10_nodes_20_msg_s"] is False and goals["p99_within_2x_js"] is False
    assert "MISSED" in bench.describe_goals(goals)

    failed = [{"impl": "companion", "topology": "mesh", "nodes": 10, "rate": 20.0, "error": "boom"}]
    goals = bench.goals(failed, bench.ratios(failed))
    assert goals["no_loss_10_nodes_20_msg_s"] is False  # a failed case is no proof of no loss
    assert goals["p99_within_2x_js"] is None
    assert "FAILED: boom" in bench.describe(failed[0])


def test_help_documents_every_flag_and_figure() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_network.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    for word in ("--impl", "--topology", "--nodes", "--rate", "--seconds", "--idle", "--json"):
        assert word in done.stdout
    for figure in ("p50", "p99", "loss", "CPU/msg", "start", "conn", "mesh", "RSS", "ratios", "goals"):
        assert figure in done.stdout, figure
