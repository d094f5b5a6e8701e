"""holdpoint keygen / sign / verify --trust, end to end: Ed25519 and HMAC keys, exit codes
(0 valid or signed, 1 invalid, 2 usage or key file), each refusal's code, the JSON
report's signer, a statement refused for another file, a revoked key, and a file
changed after signing. The library's own tests are tests/unit/signature_test.cpp."""

import json
import os
import shutil
import sys
import tempfile

import torch

import harness

cli = harness.cli
first_code = harness.first_code


def main():
    report = harness.Report("cli_sign")
    tmp = tempfile.mkdtemp(prefix="holdpoint-sign-")
    try:
        path = os.path.join(tmp, "model.pt")
        torch.save({"w": torch.arange(6.0)}, path)
        key, hmac, other = (os.path.join(tmp, name) for name in ("key", "hmac", "other"))
        for args in (("keygen", key), ("keygen", "--hmac", hmac), ("keygen", other)):
            r = cli(*args)
            report.check(r.returncode == 0 and "key id" in r.stdout, f"{' '.join(args)}: {r.describe()}")
        r = cli("keygen", key)
        report.check(r.returncode == 2 and first_code(r) == "io_open_failed", f"keygen over a key: {r.describe()}")

        def verify(*extra):
            return cli("verify", path, "--trust", key + ".pub", *extra)

        r = verify()
        report.check(r.returncode == 1 and first_code(r) == "signature_missing", f"unsigned: {r.describe()}")
        r = verify("--signature-optional")
        report.check(r.returncode == 0, f"unsigned, optional: {r.describe()}")
        r = cli("sign", path, "--key", key)
        report.check(r.returncode == 0 and os.path.exists(path + ".sig"), f"sign: {r.describe()}")
        r = verify("--json")
        body = json.loads(r.stdout) if r.returncode == 0 else {}
        report.check(r.returncode == 0 and body.get("digest_checked") and len(body.get("signed_by", "")) == 32,
                     f"signed, trusted: {r.describe()}")
        r = cli("verify", path, "--trust", other + ".pub")
        report.check(r.returncode == 1 and first_code(r) == "signature_key_unknown", f"another key: {r.describe()}")
        revoked = os.path.join(tmp, "revoked.txt")
        with open(revoked, "w") as f:
            f.write(body.get("signed_by", "0" * 32) + "\n")
        r = verify("--revoked", revoked)
        report.check(r.returncode == 1 and first_code(r) == "signature_key_revoked", f"revoked: {r.describe()}")
        r = cli("verify", path, "--trust", path)
        report.check(r.returncode == 2 and first_code(r) == "key_file_invalid", f"a checkpoint as key: {r.describe()}")

        # HMAC: the same secret signs and verifies.
        r = cli("sign", path, "--key", hmac)
        report.check(r.returncode == 0, f"sign with HMAC: {r.describe()}")
        r = cli("verify", path, "--trust", hmac)
        report.check(r.returncode == 0 and "signed by key" in r.stdout, f"HMAC verify: {r.describe()}")

        # The statement names model.pt: copied beside another name, it is refused.
        copy = os.path.join(tmp, "copy.pt")
        shutil.copy(path, copy)
        shutil.copy(path + ".sig", copy + ".sig")
        r = cli("verify", copy, "--trust", hmac)
        report.check(r.returncode == 1 and first_code(r) == "signature_statement_mismatch", f"renamed: {r.describe()}")
        with open(path + ".sig", "r+") as f:
            text = f.read().replace("algorithm hmac-sha256", "algorithm hmac-sha-256")
            f.seek(0)
            f.write(text)
            f.truncate()
        r = cli("verify", path, "--trust", hmac)
        report.check(r.returncode == 1 and first_code(r) == "signature_malformed", f"malformed: {r.describe()}")

        # Replaced after signing: same size, other bytes.
        cli("sign", path, "--key", key)
        torch.save({"w": torch.arange(6.0) + 1}, path)
        r = verify()
        report.check(r.returncode == 1 and first_code(r) in ("sha256_mismatch", "signature_statement_mismatch"),
                     f"changed after signing: {r.describe()}")
        r = cli("sign", os.path.join(tmp, "absent.pt"), "--key", key)
        report.check(r.returncode == 2, f"sign a missing file: {r.describe()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
