"""The manager's configs: ManagerConfig.validate (the password/loopback rule, how the timeouts
relate) and the one manager link every following process takes."""
from __future__ import annotations

import orjson
import pytest

from keel.common.config import ConfigError, ManagerConfig
from keel.common.roles import from_dict

PARTNERS = {"127.0.0.1:9301": "tcp://127.0.0.1:9311", "127.0.0.1:9302": "tcp://127.0.0.1:9312"}


def test_a_raft_port_off_loopback_needs_a_password():
    partners = {"10.0.0.2:7300": "tcp://10.0.0.2:7310", "10.0.0.3:7300": "tcp://10.0.0.3:7310"}
    with pytest.raises(ConfigError, match="pysyncobj unpickles") as info:
        ManagerConfig(raft_address="10.0.0.1:7300", raft_partners=partners).validate()
    assert info.value.key == "password"
    ManagerConfig(raft_address="10.0.0.1:7300", raft_partners=partners, password="s3cret").validate()


def test_the_group_is_odd_and_does_not_name_itself():
    with pytest.raises(ConfigError, match="odd group"):
        ManagerConfig(raft_partners={"127.0.0.1:9301": "tcp://127.0.0.1:9311"}).validate()
    with pytest.raises(ConfigError, match="must not name this replica"):
        ManagerConfig(raft_address="127.0.0.1:9301", raft_partners=PARTNERS).validate()


@pytest.mark.parametrize("options, key", [
    ({"raft_min_timeout_s": 0.1, "append_entries_period_s": 0.04}, "raft_min_timeout_s"),
    ({"raft_max_timeout_s": 0.15}, "raft_max_timeout_s"),
    ({"connection_timeout_s": 0.2}, "connection_timeout_s"),
    ({"heartbeat_interval_s": 0.2, "heartbeat_liveness": 5}, "heartbeat_liveness"),
    ({"heartbeat_liveness": 1}, "heartbeat_liveness"),
])
def test_timeouts_relate(options, key):
    with pytest.raises(ConfigError) as info:
        from_dict("manager", {"raft_partners": PARTNERS, **options})
    assert info.value.key == key


def test_control_messages_are_checked_at_the_edge():
    from keel.common import protocol

    for bad in (protocol.Control(op=""), protocol.Control(op="x", args=[1]), protocol.Change(seq=-1, values={})):
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(protocol.encode(bad))


def test_keel_manager_and_bench_manager_are_commands():
    from keel.deploy.keel import parse_args

    args = parse_args(["manager", "transfer", "--endpoints", "tcp://127.0.0.1:1", "--to", "127.0.0.1:2"])
    assert (args.manager_command, args.to) == ("transfer", "127.0.0.1:2")
    assert parse_args(["bench", "manager", "--quick", "--json", "x.json"]).benchmark == "manager"
    with pytest.raises(SystemExit):
        parse_args(["manager", "show"])  # needs --endpoints or --spec


def test_a_process_config_takes_its_manager_link_as_one_table():
    """Every process that follows the manager has one ``manager`` option, a table made into a
    ``ManagerLinkConfig`` (checked like any config) and back into JSON unchanged."""
    from keel.common.config import ManagerLinkConfig, to_json

    link = {"endpoints": ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], "publish_endpoints": ["tcp://127.0.0.1:3", "tcp://127.0.0.1:4"]}
    for role in ("frontend", "dispatcher", "worker", "graph_operator"):
        config = from_dict(role, {"manager": link})
        assert config.manager == ManagerLinkConfig(**link)
        assert from_dict(role, orjson.loads(to_json(config))) == config
        assert from_dict(role, {}).manager is None
    with pytest.raises(ConfigError, match="manager: unknown option"):
        from_dict("worker", {"manager": {"endpoint": ["tcp://127.0.0.1:1"]}})
    with pytest.raises(ConfigError, match="publish_endpoints: one per replica"):
        from_dict("worker", {"manager": {"endpoints": link["endpoints"], "publish_endpoints": []}})
