"""A small certificate authority for Tessera's mutual TLS: a CA and one leaf per role.

Writes folders in the layout `tessera.rpc.transport` reads (`ca.crt`, `tls.crt`,
`tls.key`, as in a Kubernetes TLS Secret). Called by tests (which make a fresh CA per test,
and a second, foreign CA to prove it is refused) and by `tessera up --tls` for a local
deployment with TLS on. In a cluster, cert-manager or the operator's owner issues these
instead (see docs/security.md); the role goes in the subject's OU, a gateway's deployment
in a URI SAN (`tessera.policies.security.tenancy.uri`), and every certificate carries the DNS name
clients expect of agents, `transport.AGENT_SERVER_NAME`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.rpc import transport


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, unit: str = "") -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if unit:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    return x509.Name(attrs)


def make_authority(name: str = "tessera-ca", days: int = 365) -> Authority:
    """A self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
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
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def write_leaf(
    ca: Authority,
    folder: str | Path,
    role: str,
    common_name: str = "",
    days: int = 90,
    scope: str = "",
) -> Path:
    """Issue a client-and-server certificate for `role` into `folder`; returns the folder.

    `scope`: the URI SAN binding it to a deployment (`tenancy.uri(namespace, name)`)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [
        x509.DNSName(transport.AGENT_SERVER_NAME),
        x509.DNSName("localhost"),
    ]
    if scope:
        sans.append(x509.UniformResourceIdentifier(scope))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name or f"tessera-{role}", role))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    (out / "ca.crt").write_bytes(ca.pem())
    (out / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (out / "tls.key").chmod(0o600)
    return out


def write_deployment(folder: str | Path, roles: tuple[str, ...] = ()) -> dict[str, Path]:
    """A fresh CA and one leaf folder per role under `folder` (`folder/<role>/`)."""
    from tessera.policies.security import access

    ca = make_authority()
    return {r: write_leaf(ca, Path(folder) / r, r) for r in (roles or sorted(access.ROLES))}
