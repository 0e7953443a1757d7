"""TLS for every listener (SE2): the server's SSL context and the identity in a client's certificate.

The settings follow RabbitMQ's ``ssl_options`` (certfile, keyfile, cacertfile, password, verify,
fail_if_no_peer_cert) so that an operator moving from RabbitMQ reads the same words:

- ``verify_none``: no client certificate is asked for;
- ``verify_peer``: a client certificate is asked for and, when one is sent, it must chain to
  ``cafile`` or the handshake fails; with ``fail_if_no_peer_cert`` a client without one is
  refused at the handshake too.

A connection whose certificate was verified may log in with the EXTERNAL SASL mechanism
(RabbitMQ's rabbitmq_auth_mechanism_ssl): the user name is the certificate's CN, or its whole
subject DN (``ssl_cert_login_from: distinguished_name``, RabbitMQ's own default).
"""

from __future__ import annotations

import ssl
from typing import Any

from gateway.config import ConfigError, TLSSettings

__all__ = ["connection_info", "distinguished_name", "peer_username", "server_context"]

# RFC 4514 short names of the subject attributes, as RabbitMQ's rabbit_ssl prints them.
_SHORT_NAMES = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID",
}


def server_context(settings: TLSSettings) -> ssl.SSLContext:
    """The context every TLS listener uses; ConfigError (one line) for a missing or bad file."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # RabbitMQ 3.10's default versions: 1.2 and 1.3
    try:
        ctx.load_cert_chain(settings.certfile, settings.keyfile, settings.password)
    except OSError as e:  # ssl.SSLError included
        raise ConfigError(f"tls: cannot load certfile {settings.certfile!r} / keyfile "
                          f"{settings.keyfile!r}: {_reason(e)}") from None
    if settings.cafile is not None:
        try:
            ctx.load_verify_locations(cafile=settings.cafile)
        except OSError as e:  # ssl.SSLError included
            raise ConfigError(f"tls: cannot load cafile {settings.cafile!r}: {_reason(e)}") from None
    if settings.verify == "verify_peer":
        ctx.verify_mode = ssl.CERT_REQUIRED if settings.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _reason(e: OSError) -> str:
    if isinstance(e, ssl.SSLError):  # e.g. a key that does not match the certificate
        return str(e.reason or e)
    return str(e.strerror or e)


def peer_username(ssl_object: Any, login_from: str) -> str | None:
    """The user name a verified client certificate carries, None without one.

    ``getpeercert()`` is empty unless the certificate was verified against the CA, so an
    unverified certificate never names a user."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    subject = cert.get("subject", ())
    if login_from == "distinguished_name":
        return distinguished_name(subject) or None
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def distinguished_name(rdns: Any) -> str:
    """A ``getpeercert()`` subject or issuer as rabbit_ssl prints it: RFC 4514, the RDNs most
    specific first (``CN=svc,OU=...,O=...``)."""
    return ",".join("+".join(f"{_SHORT_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in reversed(rdns))


def connection_info(ssl_object: Any) -> dict[str, Any]:
    """The management API's TLS fields of a connection (RabbitMQ's ssl_* and peer_cert_*)."""
    cipher = ssl_object.cipher()
    cert = ssl_object.getpeercert() or {}
    return {
        "ssl": True,
        "ssl_protocol": (ssl_object.version() or "").lower() or None,  # "tlsv1.3", as RabbitMQ
        "ssl_cipher": cipher[0] if cipher else None,
        "peer_cert_subject": distinguished_name(cert["subject"]) if "subject" in cert else None,
        "peer_cert_issuer": distinguished_name(cert["issuer"]) if "issuer" in cert else None,
        "peer_cert_validity": f"{cert['notBefore']} - {cert['notAfter']}" if "notAfter" in cert else None,
    }


def _escape(value: str) -> str:
    """RFC 4514 section 2.4 escaping of an attribute value."""
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
