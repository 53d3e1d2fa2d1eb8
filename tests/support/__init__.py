"""Helpers shared by the unit, integration and browser tests, and by the benchmarks in
``scripts/`` (one of each: look here before writing one). Imported as ``support.NAME``: pytest
and mypy find the package through ``pyproject.toml``, a benchmark puts ``tests/`` on its path.

- cards: the test card and test metadata, ``write_card``, ``speaking_card``
- recorders: ``Sink`` (a publisher that records) and ``Recorder`` (a handler that records)
- engines, scripted, models, conversations, faults, routines, actions: building blocks of the
  engine, model, conversation, fault and action tests
- nodes: raw py-libp2p peers and our node in a test's nursery
- bridges, clients, logs, layouts: in-memory bridges, client doubles, captured logs, data
  directory fixtures
- network, live, live_bridge, listening, mixed, js, netns, cli: processes on 127.0.0.1 (nodes,
  bridges, ``companion`` commands, js peers, network namespaces), each stopped by its PID, and
  ``publish_until_heard``
- node_driver, raw_publisher (with commands), fake_llm_server: helper processes and servers
  the tests start
- voice: a fake model voiced a sentence at a time, Juniper on it behind a bridge
- processes, hostile_payloads: process clean-up; hostile payloads for the edge
- cputime: a pytest plugin that reports each test's CPU seconds (``--cpu-durations=N``)
"""
