"""A throw-away CA and certificates for the TLS tests (SE2), made with trustme.

Files, in one directory: ``ca.pem``; ``server.pem`` / ``server.key`` (for localhost, 127.0.0.1
and ::1); client certificate + key files ``client.pem`` (CN ``svc``), ``nobody.pem`` (CN of a
user that does not exist) and ``rogue.pem`` (CN ``svc``, signed by another CA).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography import x509

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client: Path
    nobody: Path
    rogue: Path
    nobody_name: str

    def client_context(self, client_cert: Path | None = None) -> ssl.SSLContext:
        """What a client uses: trusts our CA, checks the host name, presents ``client_cert``."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if client_cert is not None:
            ctx.load_cert_chain(str(client_cert))
        return ctx

    @staticmethod
    def subject_dn(cert_file: Path) -> str:
        """The RFC 4514 subject, by the cryptography package (an independent reference)."""
        return x509.load_pem_x509_certificate(cert_file.read_bytes()).subject.rfc4514_string()


def make_certs(directory: Path, nobody_name: str = "nobody-tls") -> Certs:
    ca, other_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    server = ca.issue_cert("localhost", "127.0.0.1", "::1")
    server.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    for name, issuer, cn in (("client", ca, "svc"), ("nobody", ca, nobody_name), ("rogue", other_ca, "svc")):
        issuer.issue_cert(common_name=cn).private_key_and_cert_chain_pem.write_to_path(str(directory / f"{name}.pem"))
    return Certs(directory, directory / "ca.pem", directory / "server.pem", directory / "server.key",
                 directory / "client.pem", directory / "nobody.pem", directory / "rogue.pem", nobody_name)
