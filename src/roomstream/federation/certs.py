"""TLS certificates for development and tests, made with ``cryptography``.

:func:`self_signed` is what ``roomstream gen-cert`` writes: a certificate for a server
name's host (a DNS name, or an IP address) signed by its own key. Other servers accept
it only with ``federation.verify_certificates: false`` or with the certificate itself in
their ``federation.ca_certificates_path``. :class:`TestCertificateAuthority` issues
certificates for several servers from one CA, so that servers verify each other with
verification on (the tests do).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["CertificatePair", "TestCertificateAuthority", "self_signed"]


@dataclass(frozen=True)
class CertificatePair:
    """A PEM certificate and its PEM private key (unencrypted)."""

    certificate_pem: bytes
    private_key_pem: bytes


def _host(server_name: str) -> str:
    if server_name.startswith("["):
        return server_name[1 : server_name.index("]")]
    return server_name.rsplit(":", 1)[0] if ":" in server_name else server_name


def _subject_alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _builder(subject: str, issuer: x509.Name, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def self_signed(server_name: str, days: int = 365) -> CertificatePair:
    """A self-signed certificate for ``server_name``'s host (its port dropped)."""
    host = _host(server_name)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    certificate = (
        _builder(host, name, days)
        .public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName([_subject_alt_name(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return CertificatePair(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key))


class TestCertificateAuthority:
    """A throwaway CA issuing server certificates (tests and local multi-server setups)."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str = "roomstream test CA", days: int = 30) -> None:
        self.days = days
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        certificate = (
            _builder(name, self._name, days)
            .public_key(self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self._certificate = certificate
        self.certificate_pem = certificate.public_bytes(serialization.Encoding.PEM)

    def issue(self, *hosts: str) -> CertificatePair:
        """A certificate for ``hosts`` (DNS names or IP addresses) signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = (
            _builder(hosts[0], self._name, self.days)
            .public_key(key.public_key())
            .add_extension(
                x509.SubjectAlternativeName([_subject_alt_name(h) for h in hosts]), critical=False
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return CertificatePair(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key))
