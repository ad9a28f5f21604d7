"""On the devices in helpers.SAMPLED (CL unless TEST_DEVICES names the devices), each test function
parametrized over `device` runs its first case only: every op test runs there once, at a cost the
default run can afford."""
from __future__ import annotations
import pytest
from helpers import SAMPLED

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  seen: set[tuple[str, str, str]] = set()
  keep, dropped = [], []
  for item in items:
    device = getattr(item, "callspec", None) and item.callspec.params.get("device")
    if device in SAMPLED:
      key = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name), device)
      if key in seen:
        dropped.append(item)
        continue
      seen.add(key)
    keep.append(item)
  if dropped:
    config.hook.pytest_deselected(items=dropped)
    items[:] = keep
