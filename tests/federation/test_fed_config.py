"""The federation config section: defaults, and one line per mistake."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from cryptography import x509

from roomstream.cli import main
from roomstream.config import DEFAULT_IP_RANGE_BLACKLIST, ConfigError, parse_config


def test_defaults() -> None:
    federation = parse_config({}).federation
    assert federation.port is None
    assert federation.bind_host == "127.0.0.1"
    assert federation.verify_certificates is True
    assert federation.ip_range_blacklist == DEFAULT_IP_RANGE_BLACKLIST
    assert "127.0.0.0/8" in federation.ip_range_blacklist
    assert federation.trusted_key_servers == ()


def test_full_section(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    federation = parse_config(
        {
            "federation": {
                "port": 8448,
                "tls_certificate_path": str(cert),
                "tls_private_key_path": str(key),
                "ip_range_blacklist": [],
                "trusted_key_servers": [
                    {"server_name": "matrix.org", "verify_keys": {"ed25519:auto": "Noi6"}}
                ],
                "verify_certificates": False,
            }
        }
    ).federation
    assert federation.port == 8448
    assert federation.ip_range_blacklist == ()
    assert federation.trusted_key_servers[0].server_name == "matrix.org"
    assert federation.trusted_key_servers[0].verify_keys == {"ed25519:auto": "Noi6"}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"port": 70000}, "federation.port must be a port number in 1..65535, not 70000"),
        ({"port": 8448}, "federation.tls_certificate_path is required with federation.port"),
        (
            {"port": 8448, "tls_certificate_path": "/nonexistent/c.pem"},
            "/nonexistent/c.pem is not a readable file",
        ),
        ({"ip_range_blacklist": ["10.0.0.0/8", "nonsense"]}, "'nonsense' is not an IP range"),
        ({"ip_range_blacklist": "10.0.0.0/8"}, "ip_range_blacklist must be a list"),
        ({"trusted_key_servers": [{"name": "x"}]}, r"trusted_key_servers\[0\] must be"),
        ({"trusted_key_servers": "matrix.org"}, "trusted_key_servers must be a list"),
        ({"verify_certificates": "yes"}, "federation.verify_certificates must be true or false"),
        ({"request_timeout": 0}, "federation.request_timeout must be positive"),
        ({"colour": "red"}, "unknown keys in federation: colour"),
        ({"old_signing_keys": {"ed25519:a": {"key": "x"}}}, "old_signing_keys.ed25519:a must be"),
        ({"ca_certificates_path": "/nonexistent/ca.pem"}, "ca_certificates_path"),
        ("yes", "federation must be a mapping"),
    ],
)
def test_mistakes_are_one_line_each(section: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"federation": section})
    matching = [p for p in info.value.problems if re.search(message, p)]
    assert matching, info.value.problems
    assert all("\n" not in p for p in info.value.problems)


def test_listener_instance_must_exist(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match=r"federation\.instance names 'fed'"):
        parse_config(
            {
                "instances": {"main": {}},
                "federation": {
                    "port": 8448,
                    "instance": "fed",
                    "tls_certificate_path": str(cert),
                    "tls_private_key_path": str(cert),
                },
            }
        )


def test_gen_cert(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"server_name: example.test\ndata_dir: {tmp_path / 'data'}\n")
    assert main(["-c", str(config), "gen-cert"]) == 0
    cert_path = tmp_path / "data" / "example.test.tls.crt"
    key_path = tmp_path / "data" / "example.test.tls.key"
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["example.test"]
    assert os.stat(key_path).st_mode & 0o077 == 0
    before = cert_path.read_bytes()
    assert main(["-c", str(config), "gen-cert"]) == 2  # never replaced silently
    assert cert_path.read_bytes() == before
    assert main(["-c", str(config), "gen-cert", "--force", "--server-name", "1.2.3.4:8448"]) == 0
    ip_cert = x509.load_pem_x509_certificate(
        (tmp_path / "data" / "1.2.3.4_8448.tls.crt").read_bytes()
    )
    ip_names = ip_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in ip_names.get_values_for_type(x509.IPAddress)] == ["1.2.3.4"]
