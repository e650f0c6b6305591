"""Signed releases: what binds a build's manifest, report and model together, and who vouches for them.

Without a key, the gate checks that the three agree: ``report.json`` names the model it validated
and its sha256, the manifest lists that model with the same sha256 and the report itself, and the
manifest's summary is the report's. Someone who can write the folder can still forge all three
consistently, so a release is signed: ``deploy sign OUT --key release.key`` signs the whole output
folder (every file, so the manifest, the report, every artifact, the inputs' and the config's
hashes it lists) with OpenSSF model-signing (an elliptic-curve key, offline, no transparency log),
and ``deploy gate OUT --verify-key release.pub`` refuses any change, any added and any removed file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgedeploy.errors import ArtifactIntegrityError, InputError
from edgedeploy.fileio.outdir import CACHE_DIR, DEVICE_OUTPUTS, FAILED_DIR, SIGNATURE
from edgedeploy.jsonread import read_json

UNSIGNED = (CACHE_DIR, FAILED_DIR, SIGNATURE)  # inside an output folder, not part of the release
BUNDLE_MANIFEST = "bundle/bundle.json"


def release_model(metrics: dict[str, Any], sha256: Callable[[str], str]) -> dict[str, Any] | None:
    """The ``model`` block of report.json: the deployable artifact, its sha256, and how it was validated.

    For TensorRT targets the artifact is the device bundle, pinned by ``bundle/bundle.json`` (which
    lists every bundle file's sha256); its engine is validated on the device.
    """
    artifact = (metrics.get("build") or {}).get("artifact")
    if not artifact:
        return None
    if artifact.rstrip("/") == "bundle":
        return {"artifact": BUNDLE_MANIFEST, "sha256": sha256(BUNDLE_MANIFEST), "validated": "on the device"}
    parity = (metrics.get("validate") or {}).get("parity") or {}
    cand = next((c for c in parity.get("candidates", []) if c.get("artifact") == artifact), None)
    validated = cand.get("status", "skipped") if cand else "not validated"
    return {"artifact": artifact, "sha256": sha256(artifact), "validated": validated}


def report_model(report: Any) -> dict[str, Any]:
    """``report.json``'s ``model`` record when it names its artifact by a file name (a string), else empty: a
    record of another type (an edited report) names no model rather than crashing whoever reads it."""
    model = report.get("model") if isinstance(report, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("artifact"), str) or not model["artifact"]:
        return {}
    return model


def binding_problems(report: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """Why this report, this manifest and the model they name do not belong together (empty: they do).

    File contents against the manifest are the integrity check's job; this checks the references.
    """
    problems = []
    artifacts = manifest.get("artifacts")
    if not isinstance(artifacts, dict) or not artifacts:
        return ["manifest.json lists no artifacts"]
    if "report.json" not in artifacts:
        problems.append("manifest.json does not list report.json")
    model = report_model(report)
    if not model:
        problems.append("report.json names no model (a release without a deployable model)")
    else:
        name = model["artifact"]
        if name not in artifacts:
            problems.append(f"report.json's model {name} is not in manifest.json (removed or renamed)")
        elif artifacts[name] != model.get("sha256"):
            problems.append(
                f"{name}: sha256 in manifest.json {str(artifacts[name])[:12]}... differs from the model "
                f"report.json validated {str(model.get('sha256'))[:12]}... (swapped)"
            )
        if name.endswith(".onnx") or name.endswith(".ts") or name.endswith(".engine"):
            parity = report.get("parity")
            cands = parity.get("candidates") if isinstance(parity, dict) else None
            measured = [c for c in (cands if isinstance(cands, list) else []) if isinstance(c, dict)]
            for c in measured:
                if c.get("artifact") == name and c.get("sha256") and c["sha256"] != model.get("sha256"):
                    problems.append(f"{name}: parity was measured on a different file than the one released")
    if manifest.get("summary") != report.get("summary"):
        problems.append("manifest.json's summary differs from report.json's (one of them was edited)")
    return problems


# ---- keys and signatures (OpenSSF model-signing, elliptic-curve keys) ------------------------------------


def _model_signing() -> Any:
    try:
        import model_signing
    except ImportError as exc:
        raise InputError(
            f"signing needs OpenSSF model-signing ({exc})", hint="pip install 'edgedeploy[sign]'"
        ) from None
    return model_signing


def _hashing_config(folder: Path) -> Any:
    ms = _model_signing()
    folder = folder.resolve()  # model-signing matches ignored paths against the resolved folder
    ignored = [folder / p for p in UNSIGNED]
    # git files are signed too: a dropped .gitattributes is a change like any other
    return ms.hashing.Config().set_ignored_paths(paths=ignored, ignore_git_paths=False)


def generate_keypair(prefix: str | Path) -> tuple[Path, Path]:
    """Write a new EC P-256 key pair: ``<prefix>.key`` (PKCS#8 PEM, mode 0600) and ``<prefix>.pub``.

    The prefix's folder is created (mode 0700) when it does not exist yet.

    Raises:
        InputError: either file already exists, or the folder cannot be created or written.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for p in (key_path, pub_path):
        if p.exists():
            raise InputError(f"{p} exists; refusing to overwrite a key", hint="choose another --generate-key PREFIX")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        pub_path.write_bytes(pub)
    except OSError as exc:
        raise InputError(
            f"cannot write the key pair {key_path} / {pub_path}: {exc.strerror or exc}",
            hint="choose a --generate-key PREFIX in a folder you can write",
        ) from None
    return key_path, pub_path


def sign_release(folder: str | Path, private_key: str | Path) -> Path:
    """Sign a build's output folder; writes ``<folder>/release.sig`` (a Sigstore bundle) and returns it.

    Only a release that verifies and whose report, manifest and model agree is signed.

    Raises:
        ArtifactIntegrityError: files differ from the manifest, or report/manifest/model disagree.
        InputError: the key is missing, unreadable or readable by others, or model-signing is not installed.
    """

    from edgedeploy.fileio.integrity import read_manifest, verify_artifacts

    folder = Path(folder).resolve()
    verify_artifacts(folder)
    manifest = read_manifest(folder) or {}
    try:
        report = read_json(folder / "report.json")
    except (OSError, ValueError) as exc:
        raise ArtifactIntegrityError(f"{folder}: report.json unreadable ({exc})") from None
    problems = binding_problems(report, manifest)
    if problems:
        raise ArtifactIntegrityError(f"{folder}: refusing to sign: " + "; ".join(problems))
    key = Path(private_key)
    if not key.is_file():
        raise InputError(f"signing key not found: {key}", hint="pass --key PATH to a PEM private key")
    mode = key.stat().st_mode & 0o777
    if os.name == "posix" and mode & 0o077:
        raise InputError(
            f"signing key {key} is readable by others (mode {mode:o}); a private key readable by others is not private",
            hint=f"chmod 600 {key} (and consider the key leaked: generate a new pair if others could read it)",
        )
    ms = _model_signing()
    fd, tmp = tempfile.mkstemp(prefix=f".{SIGNATURE}.", dir=folder.parent)
    os.close(fd)
    try:
        try:
            cfg = ms.signing.Config().use_elliptic_key_signer(private_key=key)
            cfg.set_hashing_config(_hashing_config(folder)).sign(folder, tmp)
        except ValueError as exc:  # cryptography's "could not deserialize key" and friends
            raise InputError(f"cannot sign with {key}: {' '.join(str(exc).split())[:200]}") from None
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; the signature is as public as the release
        os.replace(tmp, folder / SIGNATURE)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return folder / SIGNATURE


def verify_release(folder: str | Path, public_key: str | Path) -> None:
    """Check ``<folder>/release.sig`` against ``public_key`` and every file of the folder.

    Raises:
        ArtifactIntegrityError: no signature, a signature by another key, or any file changed,
            added or removed since signing (named).
        InputError: the public key is missing or unreadable.
    """
    folder = Path(folder).resolve()
    pub = Path(public_key)
    if not pub.is_file():
        raise InputError(f"verification key not found: {pub}", hint="pass --verify-key PATH to a PEM public key")
    sig = folder / SIGNATURE
    if not sig.is_file():
        raise ArtifactIntegrityError(f"{folder}: no {SIGNATURE}; the release is not signed", hint="deploy sign")
    ms = _model_signing()
    _check_public_key(pub)  # a wrong key file is the caller's input, not a changed folder
    try:
        cfg = ms.verifying.Config().use_elliptic_key_verifier(public_key=pub)
        cfg.set_hashing_config(_hashing_config(folder)).verify(folder, sig)
    except Exception as exc:  # model-signing raises ValueError, cryptography InvalidSignature, json errors
        why = _describe(str(exc)) or type(exc).__name__
        hint = "do not release it: rebuild and sign again, or find who changed the folder"
        if "added since signing" in why and any(n in why for n in DEVICE_OUTPUTS):
            hint = (
                "the device step's outputs are signed only by signing again after it: deploy sign OUT --key KEY "
                "once 'deploy bundle complete' passed (docs/security.md)"
            )
        raise ArtifactIntegrityError(f"{folder}: signature check failed: {why}", hint=hint) from None


MAX_KEY_BYTES = 64 << 10  # a PEM public key is a few hundred bytes


def _check_public_key(pub: Path) -> None:
    """``pub`` holds an elliptic-curve public key in PEM, the kind ``deploy sign --generate-key`` writes.

    Raises:
        InputError: unreadable, a private key, or not an EC public key in PEM (named, with the fix).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    hint = "pass the .pub file 'deploy sign --generate-key' wrote (the release's public key, not its .key)"
    try:
        with pub.open("rb") as fh:
            data = fh.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise InputError(f"verification key unreadable: {pub} ({exc.strerror or exc})", hint=hint) from None
    if b"PRIVATE KEY" in data:
        raise InputError(f"verification key {pub} is a private key", hint=hint)
    try:
        if len(data) > MAX_KEY_BYTES:
            raise ValueError("larger than a public key")
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise InputError(f"verification key {pub} is not a PEM public key ({exc})", hint=hint) from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InputError(f"verification key {pub} is not an elliptic-curve key ({type(key).__name__})", hint=hint)


def _describe(text: str) -> str:
    """model-signing's mismatch message, as changed / added / missing file names (digests dropped)."""
    import re

    # the message is a list's repr: a name is quoted 'x' or, when a digest holds a quote, \\'x\\'
    changed = re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", text)
    added = re.search(r"Extra files found in model \\?'[^']*\\?': ([^\]\"]+)", text)
    missing = re.search(r"Missing files in model \\?'[^']*\\?': ([^\]\"]+)", text)
    parts = []
    if changed:
        parts.append("changed since signing: " + ", ".join(changed))
    if added:
        parts.append("added since signing: " + added.group(1).strip(" '"))
    if missing:
        parts.append("removed since signing: " + missing.group(1).strip(" '"))
    return "; ".join(parts) or " ".join(text.split())[:300]
