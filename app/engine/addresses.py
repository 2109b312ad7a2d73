"""Is an IP address globally routable? The webhook SSRF guard's address model.

docs/security.md ("SSRF guard"), docs/adr/0053-webhook-guard-address-model.md. The
decision comes from the standard library's :mod:`ipaddress` (``is_global``, the
``is_*`` flags, ``ipv4_mapped``, ``sixtofour``, ``teredo``), not from a hand-kept list of
private ranges. Two things are added to it:

- **Embedded IPv4.** An IPv6 address that carries an IPv4 address (IPv4-mapped
  ``::ffff:0:0/96``, IPv4-compatible ``::/96``, 6to4 ``2002::/16``, Teredo
  ``2001::/32``'s server and client, NAT64 ``64:ff9b::/96``) is refused when the IPv4
  address it carries is not global: a packet to ``2002:7f00:1::`` or
  ``64:ff9b::a9fe:a9fe`` may well end at ``127.0.0.1`` or the cloud metadata endpoint.
  Only the IPv4-mapped form and the NAT64 well-known prefix are accepted when what they
  carry is global (the first is how a dual-stack socket names an IPv4 peer; the second
  is what DNS64 answers for a public host on an IPv6-only network, RFC 6052 §3.1 keeps
  non-global IPv4 out of it); the others are deprecated or not globally routable as a
  whole and refused whatever they carry.
- **Registry entries Python 3.11 lacks.** :data:`NEWER_NOT_GLOBAL` holds the
  non-global blocks that Python's ``ipaddress`` tables gained after 3.11 (they are in
  3.13's): the project supports 3.11, whose ``is_global`` still calls them global.
  Drop the tuple once ``requires-python`` reaches a release that has them all.

Beyond ``is_global``, multicast (which ``is_global`` lets through), reserved (unallocated)
and site-local (``fec0::/10``, deprecated by RFC 3879 but still routed by some stacks)
addresses are refused.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IpAddress = IPv4Address | IPv6Address

NAT64_WELL_KNOWN = IPv6Network("64:ff9b::/96")
"""RFC 6052 §2.1: the IPv4 address is the last 32 bits; global IPv4 only (§3.1)."""

NEWER_NOT_GLOBAL: tuple[IPv4Network | IPv6Network, ...] = (
    IPv4Network("192.0.0.0/24"),  # IETF protocol assignments (RFC 6890); 3.11 has parts
    IPv6Network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215): a private translator
    IPv6Network("2002::/16"),  # 6to4 (deprecated relays, RFC 7526)
    IPv6Network("3fff::/20"),  # documentation (RFC 9637)
)
"""Non-global blocks of the IANA special-purpose registries that Python 3.11's
``ipaddress`` still calls global (Python 3.13's tables have them)."""

_IPV4_COMPATIBLE = IPv6Network("::/96")  # RFC 4291 §2.5.5.1, deprecated


def embedded_ipv4(address: IPv6Address) -> list[tuple[str, IPv4Address]]:
    """The IPv4 addresses ``address`` carries, each with the name of its form.

    Returns:
        ``[(form, ipv4), ...]``: empty for an address of no embedding form; two for
        Teredo (its server, then its client, un-obfuscated by :mod:`ipaddress`). ``::``
        and ``::1`` are not IPv4-compatible addresses (RFC 4291 §2.5.5.1).
    """
    found: list[tuple[str, IPv4Address]] = []
    if address.ipv4_mapped is not None:
        found.append(("IPv4-mapped", address.ipv4_mapped))
    if address.sixtofour is not None:
        found.append(("6to4", address.sixtofour))
    if address.teredo is not None:
        server, client = address.teredo
        found += [("Teredo (server)", server), ("Teredo (client)", client)]
    low32 = IPv4Address(int(address) & 0xFFFF_FFFF)
    if address in NAT64_WELL_KNOWN:
        found.append(("NAT64", low32))
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        found.append(("IPv4-compatible", low32))
    return found


def _own_refusal(address: IpAddress) -> str | None:
    """Why ``address`` itself (not what it embeds) is not globally routable."""
    checks = [
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("site-local", isinstance(address, IPv6Address) and address.is_site_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        (
            "not globally routable",
            # (an address is in no block of the other version)
            not address.is_global or any(address in block for block in NEWER_NOT_GLOBAL),
        ),
    ]
    for kind, hit in checks:
        if hit:
            return f"{kind} address {address}"
    return None


def refusal(address: IpAddress) -> str | None:
    """Why the webhook guard refuses to connect to ``address``; None when it is global.

    The rule is the module docstring's: not global by :mod:`ipaddress` (plus
    :data:`NEWER_NOT_GLOBAL`), multicast, reserved or site-local; or an IPv6 address
    carrying a non-global IPv4 address (:func:`embedded_ipv4`). IPv4-mapped and NAT64
    well-known-prefix addresses are judged by the IPv4 address they carry.

    Returns:
        A phrase for the error, e.g. ``"loopback address 127.0.0.1"`` or ``"6to4 address
        2002:7f00:1:: carrying loopback address 127.0.0.1"``; None for a global address.
    """
    if isinstance(address, IPv4Address):
        return _own_refusal(address)
    for form, carried in embedded_ipv4(address):
        why = _own_refusal(carried)
        if why is not None:
            return f"{form} address {address} carrying {why}"
    if address.ipv4_mapped is not None or address in NAT64_WELL_KNOWN:
        return None  # packets go to the IPv4 address, global as checked above
    return _own_refusal(address)
