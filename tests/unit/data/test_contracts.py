"""The module contracts are read through attribute access, which finds an nn.Module's submodules."""

from __future__ import annotations

import torch

from ragen2.data.contracts import held_policy


class _Module(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.policy = None


def test_a_policy_assigned_as_a_submodule_is_found() -> None:
    module = _Module()
    assert held_policy(module) is None
    module.policy = torch.nn.Linear(2, 2)  # nn.Module.__setattr__ moves it into _modules
    assert "policy" not in vars(module) and held_policy(module) is module.policy


def test_an_object_without_a_policy_holds_none() -> None:
    assert held_policy(object()) is None
