"""The shared contracts on every adapted environment that runs without a server of its own: the environment
contract (tests/envs/test_all_envs.py) and the config contract, each adapter skipped, naming the install, where its
package is not installed. OpenEnv's run in tests/envs/test_openenv.py, against the server that file starts."""

from __future__ import annotations

import pytest

from envs.adapted import ADAPTED
from envs.adapter_checks import ENV_CONTRACT, check_config_contract

SERVERLESS = [a for a in ADAPTED.values() if a.conf != "openenv"]


@pytest.mark.parametrize(
    ("env_id", "check"),
    [
        pytest.param(a.env_id, check, marks=a.needed(), id=f"{a.conf}-{check.__name__.removeprefix('test_')}")
        for a in SERVERLESS
        for check in ENV_CONTRACT
    ],
)
def test_the_shared_env_contract(env_id: str, check) -> None:
    check(env_id)


@pytest.mark.parametrize("conf", [pytest.param(a.conf, marks=a.needed(), id=a.conf) for a in SERVERLESS])
def test_the_shared_config_contract(tokenizer, conf: str) -> None:
    check_config_contract(ADAPTED[conf], tokenizer)
