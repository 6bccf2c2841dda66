"""Offline checks of the manifests under deploy/kubernetes (run by ./validate, which installs
kubernetes-validate into a venv first).

1. Every document of every manifest validates against the Kubernetes OpenAPI schemas that
   kubernetes-validate bundles, strictly (an unknown field is an error), for each Kubernetes
   version given; a kind without a schema is an error too, not a warning, so a misspelled
   `kind` cannot slip through. Duplicate mapping keys are errors (YAML would keep the last).
2. Each kustomization.yaml lists every manifest of its directory and nothing missing, so
   `kubectl apply -k` applies what was validated.
3. Every ConfigMap that holds egressd config is written out as the directory a pod sees (with
   the Secrets projected beside it in the same volume, filled with a stand-in key since the
   real one is not in git) and checked with `egressd validate`.

Usage: check_manifests.py EGRESSD_BINARY ROOT K8S_VERSION...
"""

import base64
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from kubernetes_validate import utils as kv

CONFIG_API_GROUPS = ("egressd.dev/", "gateway.networking.k8s.io/")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys in a mapping."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates
)


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=StrictLoader) if d is not None]


def name_of(doc):
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{doc.get('kind')}/{(ns + '/') if ns else ''}{meta.get('name')}"


def check_schemas(path, docs, versions, errors):
    for doc in docs:
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
            errors.append(f"{path}: a document without apiVersion and kind")
            continue
        for version in versions:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as e:
                where = ".".join(str(p) for p in e.path) or "(top level)"
                errors.append(f"{path}: {name_of(doc)} (Kubernetes {version}): {where}: {e.message}")
            except kv.SchemaNotFoundError:
                errors.append(
                    f"{path}: {name_of(doc)}: no schema for apiVersion {doc.get('apiVersion')} "
                    f"kind {doc.get('kind')} in Kubernetes {version}"
                )
            except (kv.VersionNotSupportedError, kv.InvalidSchemaError) as e:
                errors.append(f"{path}: {name_of(doc)}: {e}")


def generator_files(kust):
    """The files the kustomization's configMapGenerator and secretGenerator read (`key=path`
    entries by path)."""
    for kind in ("configMapGenerator", "secretGenerator"):
        for gen in kust.get(kind) or []:
            for entry in gen.get("files") or []:
                yield entry.split("=", 1)[-1]


def git_ignored(path):
    run = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=path.parent)
    return run.returncode == 0


def check_kustomization(directory, errors):
    """Resources listed are the manifests present (generator inputs apart). A Kustomization
    must build from a fresh checkout: every file its generators read is in the repository. A
    Component may read a file each cluster makes (a key), which git must ignore."""
    path = directory / "kustomization.yaml"
    (kust,) = load_docs(path)
    inputs = set(generator_files(kust))
    listed = {r for r in kust.get("resources") or [] if not (directory / r).is_dir()}
    present = {
        p.name
        for p in directory.glob("*.yaml")
        if p.name != "kustomization.yaml" and p.name not in inputs
    }
    for name in sorted(listed - present):
        errors.append(f"{path}: resource {name} does not exist")
    for name in sorted(present - listed):
        errors.append(f"{path}: {name} is not listed in resources, so `kubectl apply -k` skips it")
    component = kust.get("kind") == "Component"
    for name in sorted(inputs):
        file = directory / name
        if component and not file.exists() and not git_ignored(file):
            errors.append(f"{path}: {name} is made per cluster but git does not ignore it")
        elif not component and not file.exists():
            errors.append(
                f"{path}: {name} does not exist: the kustomization does not build from a fresh "
                "checkout (make it a component's input, as gateway/mcp does with its key)"
            )
    return kust


def is_egressd_config(configmap):
    for key, value in (configmap.get("data") or {}).items():
        if key.endswith((".yaml", ".yml")) and any(
            f"apiVersion: {group}" in value for group in CONFIG_API_GROUPS
        ):
            return True
    return False


def pod_specs(docs):
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc.get("kind") == "Pod":
            yield spec
        elif "template" in spec:  # Deployment, StatefulSet, DaemonSet, Job
            yield (spec["template"] or {}).get("spec") or {}


def volume_layouts(all_docs, configmap_name):
    """For each pod volume that includes the ConfigMap: the Secret keys projected beside it."""
    for spec in pod_specs(all_docs):
        for volume in spec.get("volumes") or []:
            if (volume.get("configMap") or {}).get("name") == configmap_name:
                yield volume["name"], []
            sources = (volume.get("projected") or {}).get("sources") or []
            if any((s.get("configMap") or {}).get("name") == configmap_name for s in sources):
                extra = []
                for s in sources:
                    secret = s.get("secret")
                    if secret:
                        extra.append((secret["name"], [i["path"] for i in secret.get("items") or []]))
                yield volume["name"], extra


def check_egressd_configs(egressd, manifests, generated_secrets, errors):
    all_docs = [d for _, docs in manifests for d in docs]
    known_secrets = generated_secrets | {
        d["metadata"]["name"] for d in all_docs if d.get("kind") == "Secret"
    }
    checked = 0
    for path, docs in manifests:
        for cm in docs:
            if cm.get("kind") != "ConfigMap" or not is_egressd_config(cm):
                continue
            name = cm["metadata"]["name"]
            layouts = list(volume_layouts(all_docs, name)) or [(None, [])]
            for volume, secrets_beside in layouts:
                with tempfile.TemporaryDirectory(prefix="egressd-cm-") as tmp:
                    out = Path(tmp) / name
                    out.mkdir()
                    for key, value in cm["data"].items():
                        (out / key).write_text(value)
                    for secret, files in secrets_beside:
                        if secret not in known_secrets:
                            errors.append(
                                f"{path}: volume {volume} projects Secret {secret}, which is "
                                "neither a manifest nor made by a secretGenerator"
                            )
                        for f in files:
                            # A stand-in of the real key's shape (44 base64 characters).
                            stand_in = base64.b64encode(secrets.token_bytes(32)).decode()
                            (out / f).write_text(stand_in + "\n")
                    run = subprocess.run(
                        [egressd, "validate", str(out)], capture_output=True, text=True
                    )
                    what = f"{path}: ConfigMap {name}" + (f" as volume {volume}" if volume else "")
                    summary = (run.stdout.strip().splitlines() or [""])[-1]
                    if run.returncode != 0:
                        errors.append(f"{what}: egressd validate failed:\n{run.stdout}{run.stderr}")
                    else:
                        print(f"ok    {what}: {summary}")
                    checked += 1
    return checked


def validate_dir(egressd, files, what, errors):
    """Writes `files` (name: text) into a directory and runs `egressd validate` on it."""
    with tempfile.TemporaryDirectory(prefix="egressd-cm-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        run = subprocess.run([egressd, "validate", tmp], capture_output=True, text=True)
        summary = (run.stdout.strip().splitlines() or [""])[-1]
        if run.returncode != 0:
            errors.append(f"{what}: egressd validate failed:\n{run.stdout}{run.stderr}")
        else:
            print(f"ok    {what}: {summary}")


def check_components(egressd, kustomizations, manifests, errors):
    """Each component's ConfigMap merged into its parent's ConfigMap of that name, as
    kustomize makes it (keys replaced or added), validated with the Secrets it generates
    beside it (stand-ins); a ProxyConfig it replaces must equal the parent's but for `mcp`."""
    configmaps = {
        cm["metadata"]["name"]: cm
        for _, docs in manifests
        for cm in docs
        if cm.get("kind") == "ConfigMap"
    }
    checked = 0
    for directory, kust in kustomizations.items():
        if kust.get("kind") != "Component":
            continue
        stand_ins = {
            f: base64.b64encode(secrets.token_bytes(32)).decode() + "\n"
            for gen in kust.get("secretGenerator") or []
            for f in gen.get("files") or []
        }
        for gen in kust.get("configMapGenerator") or []:
            base = configmaps.get(gen["name"])
            what = f"{directory}: ConfigMap {gen['name']} with this component"
            if gen.get("behavior") != "merge" or base is None:
                errors.append(f"{what}: expected `behavior: merge` into a ConfigMap of the base")
                continue
            files = dict(base.get("data") or {})
            for entry in gen.get("files") or []:
                key, _, source = entry.rpartition("=")
                text = (directory / source).read_text()
                key = key or source
                if key in files:
                    check_same_but_mcp(files[key], text, f"{what}: {key}", errors)
                files[key] = text
            validate_dir(egressd, {**files, **stand_ins}, what, errors)
            checked += 1
    return checked


def check_same_but_mcp(base_text, text, what, errors):
    def specs(t):
        return [
            {k: v for k, v in (d.get("spec") or {}).items() if k != "mcp"}
            for d in yaml.safe_load_all(t)
            if d
        ]

    if specs(base_text) != specs(text):
        errors.append(f"{what}: differs from the base's in more than the `mcp` section")


def check_image_tags(root, manifests, kustomizations, errors):
    """egressd's image is tagged with the crate's version everywhere, and the Dockerfile's
    documented build makes that tag."""
    repo = root.parent.parent
    cargo = (repo / "Cargo.toml").read_text()
    version = next(
        line.split('"')[1] for line in cargo.splitlines() if line.startswith("version = ")
    )
    wanted = f"egressd:{version}"
    for path, docs in manifests:
        for spec in pod_specs(docs):
            for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
                image = c.get("image", "")
                if image.split(":")[0] == "egressd" and image != wanted:
                    errors.append(f"{path}: image {image}, but Cargo.toml says {wanted}")
    for directory, kust in kustomizations.items():
        for image in kust.get("images") or []:
            if image.get("name") == "egressd" and image.get("newTag") != version:
                errors.append(
                    f"{directory}/kustomization.yaml: images newTag {image.get('newTag')}, "
                    f"but Cargo.toml says {version}"
                )
    dockerfile = (repo / "Dockerfile").read_text()
    if f"docker build -t {wanted} ." not in dockerfile:
        errors.append(f"Dockerfile: its documented build does not tag {wanted}")


def build_with_kubectl(kustomizations, errors):
    """With kubectl at hand, each Kustomization builds as it is in git, and with each of its
    components (their per-cluster files made up in a copy)."""
    if shutil.which("kubectl") is None:
        print("skip  kubectl kustomize: no kubectl on this machine")
        return
    for directory, kust in kustomizations.items():
        if kust.get("kind") == "Component":
            continue
        variants = [None] + [
            c for c, k in kustomizations.items()
            if k.get("kind") == "Component" and c.parent == directory
        ]
        for component in variants:
            with tempfile.TemporaryDirectory(prefix="egressd-kustomize-") as tmp:
                copy = Path(tmp) / directory.name
                shutil.copytree(directory, copy)
                what = f"{directory}" + (f" with {component.name}/" if component else "")
                if component:
                    comp = copy / component.name
                    for f in generator_files(kustomizations[component]):
                        if not (comp / f).exists():
                            (comp / f).write_text(base64.b64encode(secrets.token_bytes(32)).decode())
                    with open(copy / "kustomization.yaml", "a") as k:
                        k.write(f"components:\n- {component.name}\n")
                run = subprocess.run(
                    ["kubectl", "kustomize", str(copy)], capture_output=True, text=True
                )
                if run.returncode != 0:
                    errors.append(f"{what}: kubectl kustomize failed: {run.stderr.strip()}")
                else:
                    print(f"ok    kubectl kustomize {what}")


def main():
    egressd, root, versions = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    errors = []
    manifests = []
    directories = sorted({p.parent for p in root.rglob("kustomization.yaml")})
    kustomizations = {d: check_kustomization(d, errors) for d in directories}
    generated_secrets = {
        gen["name"] for k in kustomizations.values() for gen in k.get("secretGenerator") or []
    }
    inputs = {d / f for d, k in kustomizations.items() for f in generator_files(k)}
    for path in sorted(root.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or path in inputs:
            continue
        if path.parent not in directories:
            errors.append(f"{path}: not in a directory with a kustomization.yaml")
        try:
            docs = load_docs(path)
        except yaml.YAMLError as e:
            errors.append(f"{path}: not valid YAML: {e}")
            continue
        manifests.append((path, docs))
        before = len(errors)
        check_schemas(path, docs, versions, errors)
        if len(errors) == before:
            print(f"ok    {path}: {', '.join(name_of(d) for d in docs)} (Kubernetes {', '.join(versions)})")
    checked = check_egressd_configs(egressd, manifests, generated_secrets, errors)
    checked += check_components(egressd, kustomizations, manifests, errors)
    check_image_tags(root, manifests, kustomizations, errors)
    build_with_kubectl(kustomizations, errors)
    if checked == 0:
        errors.append(f"no egressd config found in any ConfigMap under {root}")
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    if errors:
        print(f"{len(errors)} error(s)", file=sys.stderr)
        return 1
    print(f"{len(manifests)} manifest file(s), {checked} egressd config(s): all valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
