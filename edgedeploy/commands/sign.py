"""``deploy sign OUT --key KEY`` / ``deploy sign --generate-key PREFIX``: sign a build's output folder."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sign",
        help="sign a build's output folder (release.sig, OpenSSF model-signing); deploy gate --verify-key checks it",
    )
    p.add_argument("out", nargs="?", default=None, help="the build's output folder")
    p.add_argument("--key", default=None, help="PEM elliptic-curve private key (keep it in your CI's secret store)")
    p.add_argument(
        "--generate-key",
        default=None,
        metavar="PREFIX",
        help="write a new key pair PREFIX.key (private, mode 0600) and PREFIX.pub, then exit",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from edgedeploy.errors import ConfigError
    from edgedeploy.fileio.signing import generate_keypair, sign_release

    if args.generate_key:
        key, pub = generate_keypair(args.generate_key)
        print(f"wrote {key} (private: store it as a CI secret) and {pub} (public: give it to deploy gate)")
        return 0
    if not args.out or not args.key:
        raise ConfigError("deploy sign needs OUT and --key KEY", hint="deploy sign out --key release.key")
    sig = sign_release(args.out, args.key)
    print(f"signed {args.out}: {sig}")
    return 0
