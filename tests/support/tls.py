"""A self-signed TLS certificate made in the test, for https servers on loopback.

Made with ``cryptography`` (already a dependency of the console), valid for the names
and addresses given, one day long. Its own trust anchor: clients verify against it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certificate:
    """A certificate and key on disk.

    Attributes:
        certfile: PEM certificate.
        keyfile: PEM private key (unencrypted).
        spki_sha256: base64 SHA-256 of the public key (Chromium's
            ``--ignore-certificate-errors-spki-list`` takes it).
    """

    certfile: Path
    keyfile: Path
    spki_sha256: str

    def client_context(self) -> ssl.SSLContext:
        """An SSL context that trusts this certificate only."""
        return ssl.create_default_context(cafile=str(self.certfile))

    def server_context(self) -> ssl.SSLContext:
        """An SSL context serving this certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.certfile), str(self.keyfile))
        return context


def self_signed(folder: Path, names: list[str], addresses: list[str]) -> Certificate:
    """Write ``cert.pem`` and ``key.pem`` into ``folder`` for DNS ``names`` and IP ``addresses``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "test")])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        # Its own trust anchor: a CA that signed itself, for serverAuth.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return Certificate(
        certfile=certfile,
        keyfile=keyfile,
        spki_sha256=base64.b64encode(hashlib.sha256(spki).digest()).decode(),
    )
