"""SE3's address and URL rules, without the network (gateway.push_policy)."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.config import ConfigError, parse_config
from gateway.push_policy import PushPolicy, PushRefused

OPEN_WEB = PushPolicy(allow=("http://*", "https://*"))


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1", "169.254.169.254", "fe80::1",
                                     "10.1.2.3", "172.16.0.1", "192.168.0.1", "fd00::1", "0.0.0.0", "::",
                                     "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1", "240.0.0.1"])
def test_SE3_non_public_addresses_are_refused(address: str) -> None:
    with pytest.raises(PushRefused, match="SE3"):
        OPEN_WEB.check_address(ipaddress.ip_address(address), "h")


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_SE3_public_addresses_pass(address: str) -> None:
    OPEN_WEB.check_address(ipaddress.ip_address(address), "h")


def test_SE3_allow_addresses_lets_a_private_network_through() -> None:
    policy = PushPolicy(allow=("http://*",), allow_addresses=("10.1.0.0/16",))
    policy.check_address(ipaddress.ip_address("10.1.2.3"), "h")
    with pytest.raises(PushRefused):
        policy.check_address(ipaddress.ip_address("10.2.0.1"), "h")


def test_SE3_urls_must_match_a_pattern_and_literal_hosts_are_checked() -> None:
    policy = PushPolicy(allow=("https://hooks.example.com/*",))
    assert policy.check_url("https://hooks.example.com/a?b=1") == "hooks.example.com"
    for url in ("http://hooks.example.com/a", "https://hooks.example.com.evil.net/a", "https://evil.net/"):
        with pytest.raises(PushRefused, match="push.allow"):
            policy.check_url(url)
    with pytest.raises(PushRefused, match="SE3"):
        PushPolicy(allow=("http://*",)).check_url("http://127.0.0.1:8080/x")
    with pytest.raises(ValueError, match="D7"):
        OPEN_WEB.check_url("ftp://example.com/")
    with pytest.raises(PushRefused):
        PushPolicy().check_url("https://example.com/")  # nothing allowed by default


def test_SE3_the_config_s_push_section() -> None:
    cfg = parse_config({"push": {"allow": ["https://h/*"], "allow_addresses": ["10.0.0.0/8"]}})
    assert cfg.push == PushPolicy(("https://h/*",), ("10.0.0.0/8",))
    assert parse_config({}).push == PushPolicy()
    with pytest.raises(ConfigError, match="push"):
        parse_config({"push": {"allow_addresses": ["not-a-network"]}})
    with pytest.raises(ConfigError, match="push"):
        parse_config({"push": {"allow": "https://h/*"}})
