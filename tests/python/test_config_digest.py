"""Configuration digests against Python's json (issue 35; docs/resume-contract.md,
"Configuration identity").

A TrainingState whose load-bearing and operational configs hold int-keyed dicts
(where the text order "10" < "2" differs from Python's 2 < 10), nested in str-keyed
ones, is saved; the digests its manifest records must be the SHA-256 of
`json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
exactly as the docs say to compute them, and the manifest must say digest_version 2.
A dict mixing int and str keys, which json.dumps(sort_keys=True) refuses, must give
the digest of the documented general recipe (int keys first). Loading the file back
into a TrainingState with the same config is not config drift.

Exit status 0 when everything matches, 1 otherwise.
"""

import hashlib
import json
import os
import sys
import tempfile

import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


def documented_digest(fields):
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def key_order(value):
    """The general recipe of docs/resume-contract.md: sort_keys's order, and int keys
    before str keys in a dict that has both."""
    if isinstance(value, dict):
        return {k: key_order(value[k]) for k in sorted(value, key=lambda k: (isinstance(k, str), k))}
    if isinstance(value, (list, tuple)):
        return [key_order(item) for item in value]
    return value


def recipe_digest(fields):
    text = json.dumps(key_order(fields), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_of(path):
    return holdpoint.load(path)["holdpoint"]


def state_with(config, operational):
    model = torch.nn.Linear(2, 1)
    state = holdpoint.TrainingState("config-digest-test", config=config, operational=operational)
    state.add("model", model)
    return state


def main():
    report = harness.Report("config_digest")
    config = {"class_weights": {10: 1.5, 2: 0.5, -1: 0.0}, "lr": 0.1,
              "curriculum": {"stages": [{100: "hard", 20: "easy"}], "name": "two-stage"}}
    operational = {"log_every": {1000: "rare", 50: "often"}, "log_dir": "/tmp/logs"}
    mixed = {"class_weights": {10: 1.5, 2: 0.5, "default": 1.0, "1": 3.0, 1: 2.0}}
    with tempfile.TemporaryDirectory(prefix="holdpoint-config-digest-") as tmp:
        path = os.path.join(tmp, "int-keyed.pt")
        state_with(config, operational).save(path)
        manifest = manifest_of(path)
        identity = manifest["config_identity"]
        load_bearing = manifest["config"]["load_bearing"]
        report.check(load_bearing["class_weights"] == config["class_weights"],
                     f"the file holds the config given: {load_bearing['class_weights']}")
        report.check(identity["load_bearing_sha256"] == documented_digest(load_bearing),
                     f"load-bearing digest {identity['load_bearing_sha256']} is not json.dumps(sort_keys=True)'s "
                     f"{documented_digest(load_bearing)}")
        report.check(identity["operational_sha256"] == documented_digest(manifest["config"]["operational"]),
                     f"operational digest {identity['operational_sha256']} is not json.dumps(sort_keys=True)'s")
        report.check(identity.get("digest_version") == 2, f"digest_version: {identity.get('digest_version')}")
        try:
            state_with(config, operational).load(path)
            report.check(True, "same config loads")
        except holdpoint.Error as error:
            report.check(False, f"the same int-keyed config is refused: {error.code} {error}")

        path = os.path.join(tmp, "mixed.pt")
        state_with(mixed, {}).save(path)
        load_bearing = manifest_of(path)["config"]["load_bearing"]
        try:
            documented_digest(load_bearing)
            report.check(False, "json.dumps(sort_keys=True) sorted a dict of int and str keys")
        except TypeError:
            pass
        got = manifest_of(path)["config_identity"]["load_bearing_sha256"]
        report.check(got == recipe_digest(load_bearing),
                     f"mixed keys: digest {got}, recipe {recipe_digest(load_bearing)}")

        path = os.path.join(tmp, "str-keyed.pt")
        state_with({"lr": 0.1, "milestones": {1: 0, 3: 1}}, {}).save(path)
        identity = manifest_of(path)["config_identity"]
        report.check("digest_version" not in identity,
                     f"a config whose key order is the same under both rules has no digest_version: {identity}")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
