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
4. A base's ConfigMaps as its components make them, each component alone and all together in
   both orders: the components only add files and append sections to the ProxyConfig's spec
   (so they compose), the result is the base's plus their sections, and egressd validates it.
5. With kubectl installed, `kubectl kustomize` of each kustomization, with no component, each
   alone and all together: its ConfigMaps are those of 4, and its egressd configs validate in
   the volumes its Deployments mount, with its Secrets beside them.
6. egressd's image carries the version of Cargo.toml; every other image is pinned.

Usage: check_manifests.py EGRESSD_BINARY ROOT K8S_VERSION...
"""

import base64
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from kubernetes_validate import utils as kv

CONFIG_API_GROUPS = ("egressd.dev/", "gateway.networking.k8s.io/")
LOCAL_CONFIG = "config.kubernetes.io/local-config"


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
    """For each pod volume that includes the ConfigMap: the Secret items projected beside it,
    as (Secret name, [(key, path)])."""
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
                        items = [(i["key"], i["path"]) for i in secret.get("items") or []]
                        extra.append((secret["name"], items))
                yield volume["name"], extra


def stand_in_key():
    """A stand-in of a per-cluster key's shape (32 random bytes as 44 base64 characters)."""
    return base64.b64encode(secrets.token_bytes(32)).decode() + "\n"


def volume_files(configmap, secrets_beside, secret_data):
    """The files a pod sees in a volume of the ConfigMap and the Secret items beside it: an
    item's bytes from `secret_data` (Secret name: key: bytes) when known, else a stand-in."""
    files = dict(configmap.get("data") or {})
    for secret, items in secrets_beside:
        for key, path in items:
            value = (secret_data.get(secret) or {}).get(key)
            files[path] = stand_in_key() if value is None else value
    return files


def check_egressd_configs(egressd, manifests, known_secrets, secret_data, errors):
    """Every ConfigMap holding egressd config, written out as each pod volume that includes it
    (with the Secrets projected beside it), checked with `egressd validate`."""
    all_docs = [d for _, docs in manifests for d in docs]
    checked = 0
    for path, docs in manifests:
        for cm in docs:
            if cm.get("kind") != "ConfigMap" or not is_egressd_config(cm):
                continue
            name = cm["metadata"]["name"]
            for volume, beside in list(volume_layouts(all_docs, name)) or [(None, [])]:
                for secret, _ in beside:
                    if secret not in known_secrets:
                        errors.append(
                            f"{path}: volume {volume} projects Secret {secret}, which is "
                            "neither a manifest nor made by a secretGenerator"
                        )
                what = f"{path}: ConfigMap {name}" + (f" as volume {volume}" if volume else "")
                validate_dir(egressd, volume_files(cm, beside, secret_data), what, errors)
                checked += 1
    return checked


def validate_dir(egressd, files, what, errors):
    """Writes `files` (name: text or bytes) into a directory and runs `egressd validate`."""
    with tempfile.TemporaryDirectory(prefix="egressd-cm-") as tmp:
        for name, content in files.items():
            file = Path(tmp) / name
            if isinstance(content, bytes):
                file.write_bytes(content)
            else:
                file.write_text(content)
        run = subprocess.run([egressd, "validate", tmp], capture_output=True, text=True)
        summary = (run.stdout.strip().splitlines() or [""])[-1]
        if run.returncode != 0:
            errors.append(f"{what}: egressd validate failed:\n{run.stdout}{run.stderr}")
        else:
            print(f"ok    {what}: {summary}")


# A component changes its parent's egressd ConfigMap in two ways only, which compose whatever
# the order of the components: a configMapGenerator with `behavior: merge` adds files, and a
# replacement appends a fragment (a key of a local-config ConfigMap, which kustomize drops from
# its output) to a file, split at line breaks with an index past the end. A component that
# replaced a file of the base would drop what the others appended to it.


def is_local_config(generator):
    annotations = (generator.get("options") or {}).get("annotations") or {}
    return annotations.get(LOCAL_CONFIG) == "true"


def generator_entries(generator):
    """(key, file) for each of a generator's `files` (`key=file`, or `file` keyed by its name)."""
    for entry in generator.get("files") or []:
        key, _, source = entry.rpartition("=")
        yield key or Path(source).name, source


def data_key(field_path):
    """`data.[proxy.yaml]` or `data.key`: the ConfigMap key; anything else: None."""
    m = re.fullmatch(r"data\.(?:\[([^\]]+)\]|([^.\[\]]+))", field_path or "")
    return m and (m.group(1) or m.group(2))


def appends_of(replacement, fragments):
    """[(ConfigMap, key, fragment, index)] when the replacement appends a local-config
    ConfigMap's key to keys of ConfigMaps; None for any other replacement."""
    source = replacement.get("source") or {}
    text = (fragments.get(source.get("name")) or {}).get(data_key(source.get("fieldPath")))
    if set(source) - {"kind", "name", "fieldPath"} or source.get("kind") != "ConfigMap":
        return None
    if text is None or not replacement.get("targets"):
        return None
    out = []
    for target in replacement["targets"]:
        select, options = target.get("select") or {}, target.get("options") or {}
        if set(target) - {"select", "fieldPaths", "options"} or set(options) != {"delimiter", "index"}:
            return None
        if set(select) - {"kind", "name"} or select.get("kind") != "ConfigMap" or "name" not in select:
            return None
        if options["delimiter"] != "\n" or not target.get("fieldPaths"):
            return None
        for path in target["fieldPaths"]:
            if data_key(path) is None:
                return None
            out.append((select["name"], data_key(path), text, options["index"]))
    return out


def component_edits(directory, kust, base_configmaps, errors):
    """What the component does to its parent's ConfigMaps: (files merged in: {ConfigMap:
    {key: text}}, appends: [(ConfigMap, key, fragment, index)])."""
    merges, fragments, appends = {}, {}, []
    for gen in kust.get("configMapGenerator") or []:
        name = gen["name"]
        files = {key: (directory / f).read_text() for key, f in generator_entries(gen)}
        if is_local_config(gen):
            fragments[name] = files
        elif gen.get("behavior") == "merge" and name in base_configmaps:
            for key in sorted(set(files) & set(base_configmaps[name].get("data") or {})):
                errors.append(
                    f"{directory}: ConfigMap {name}: replaces the base's {key}, dropping what "
                    "other components append to it; append a fragment instead (proxy-spec.yaml)"
                )
            merges[name] = files
        else:
            errors.append(
                f"{directory}: configMapGenerator {name}: expected `behavior: merge` into a "
                "ConfigMap of the base, or a local-config ConfigMap a replacement appends"
            )
    for replacement in kust.get("replacements") or []:
        found = appends_of(replacement, fragments)
        if found is None:
            errors.append(
                f"{directory}: a replacement this check cannot follow (it knows appending a "
                f"local-config ConfigMap's key to a ConfigMap's key): {replacement}"
            )
        else:
            appends.extend(found)
    return merges, appends


def apply_components(base_configmaps, edits, what, errors):
    """The data of the base's ConfigMaps after the components' edits, in order, as kustomize
    makes it (each component's generators, then its replacements)."""
    data = {name: dict(cm.get("data") or {}) for name, cm in base_configmaps.items()}
    for merges, appends in edits:
        for name, files in merges.items():
            data[name].update(files)
        for name, key, text, index in appends:
            if key not in data.get(name, {}):
                errors.append(f"{what}: appends to {key} of ConfigMap {name}, which has none")
                continue
            lines = data[name][key].split("\n")
            if not isinstance(index, int) or index < len(lines):
                errors.append(f"{what}: index {index} replaces line {index} of {key}: not an append")
                continue
            data[name][key] = "\n".join(lines + [text])
    return data


def check_appended_sections(base_text, text, fragments, what, errors):
    """The file with the fragments appended is the base's, its last document's `spec`
    gaining the fragments' sections: none replaced, nothing else changed."""
    try:
        base = [d for d in yaml.load_all(base_text, Loader=StrictLoader) if d]
        built = [d for d in yaml.load_all(text, Loader=StrictLoader) if d]
    except yaml.YAMLError as e:
        errors.append(f"{what}: not valid YAML with the sections appended: {e}")
        return
    added = {}
    for fragment in fragments:
        section = yaml.safe_load(fragment)
        if not isinstance(section, dict):
            errors.append(f"{what}: a fragment that is not sections of a spec: {fragment!r}")
            return
        added.update(section)
    spec = (base[-1].get("spec") or {}) if base else {}
    expected = base[:-1] + [{**base[-1], "spec": {**spec, **added}}] if base else []
    if built != expected:
        errors.append(
            f"{what}: is not the base's with {', '.join(added)} added to the spec of its last "
            "document (a section appended twice or replacing the base's, or the base's file "
            "not ending in that spec)"
        )


def projected_paths(directory, kust, errors):
    """The files a component's JSON patches project into a volume beside the config: the paths
    of the items of its generated Secrets added to a projected volume's sources."""
    generated = {
        gen["name"]: {key for key, _ in generator_entries(gen)}
        for gen in kust.get("secretGenerator") or []
    }
    paths = []
    for patch in kust.get("patches") or []:
        ops = yaml.safe_load(patch.get("patch") or "") if isinstance(patch, dict) else None
        for op in ops if isinstance(ops, list) else []:
            value = op.get("value") if isinstance(op, dict) else None
            secret = value.get("secret") if isinstance(value, dict) else None
            if not secret or "/projected/sources/" not in (op.get("path") or ""):
                continue
            for item in secret.get("items") or []:
                if item.get("key") not in generated.get(secret.get("name"), set()):
                    errors.append(
                        f"{directory}: projects key {item.get('key')} of Secret "
                        f"{secret.get('name')}, which its secretGenerator does not make"
                    )
                paths.append(item["path"])
    return paths


def components_of(base_dir, kustomizations):
    return [
        d for d, k in sorted(kustomizations.items())
        if k.get("kind") == "Component" and d.parent == base_dir
    ]


def component_variants(components):
    """Each component alone, then all together in their order and reversed (they must
    compose in any order)."""
    variants = [(c,) for c in components]
    if len(components) > 1:
        variants += [tuple(components), tuple(reversed(components))]
    return variants


def configmaps_in(directory, manifests):
    return {
        d["metadata"]["name"]: d
        for path, docs in manifests
        if path.parent == directory
        for d in docs
        if d.get("kind") == "ConfigMap"
    }


def all_component_edits(kustomizations, manifests, errors):
    edits = {}
    for directory, kust in kustomizations.items():
        if kust.get("kind") == "Component":
            base = configmaps_in(directory.parent, manifests)
            edits[directory] = component_edits(directory, kust, base, errors)
    return edits


def check_components(egressd, kustomizations, manifests, edits, errors):
    """A base's ConfigMaps as its components make them, each alone and all together: a file
    they append to is the base's plus their sections, and the egressd config is valid (with
    stand-ins for the Secret items their patches project beside it). Returns how many were
    validated."""
    checked = 0
    for base_dir in kustomizations:
        base = configmaps_in(base_dir, manifests)
        for variant in component_variants(components_of(base_dir, kustomizations)):
            what = f"{base_dir} with {' and '.join(c.name + '/' for c in variant)}"
            data = apply_components(base, [edits[c] for c in variant], what, errors)
            stand_ins = {
                path: stand_in_key()
                for c in variant
                for path in projected_paths(c, kustomizations[c], errors if len(variant) == 1 else [])
            }
            for name, files in data.items():
                if files == base[name].get("data"):
                    continue
                for key in sorted({k for c in variant for n, k, _, _ in edits[c][1] if n == name}):
                    fragments = [t for c in variant for n, k, t, _ in edits[c][1] if (n, k) == (name, key)]
                    check_appended_sections(
                        base[name]["data"][key], files[key], fragments,
                        f"{what}: ConfigMap {name}: {key}", errors,
                    )
                validate_dir(egressd, {**files, **stand_ins}, f"{what}: ConfigMap {name}", errors)
                checked += 1
    return checked


def check_image_tags(root, manifests, kustomizations, errors):
    """egressd's image is tagged with the crate's version everywhere, and the Dockerfile's
    documented build makes that tag; every other image is pinned."""
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
                elif "@" not in image and image.rpartition("/")[2].partition(":")[2] in ("", "latest"):
                    errors.append(f"{path}: image {image} is not pinned (a version tag or digest)")
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


def kustomize(directory, variant, kustomizations, what, errors):
    """`kubectl kustomize` of a copy of the directory with the components of `variant` (their
    per-cluster files made up): the documents built, or None when it fails."""
    with tempfile.TemporaryDirectory(prefix="egressd-kustomize-") as tmp:
        copy = Path(tmp) / directory.name
        shutil.copytree(directory, copy)
        for component in variant:
            for f in generator_files(kustomizations[component]):
                file = copy / component.relative_to(directory) / f
                if not file.exists():
                    file.write_text(stand_in_key())
        if variant:
            with open(copy / "kustomization.yaml", "a") as k:
                k.write("components:\n" + "".join(f"- {c.name}\n" for c in variant))
        run = subprocess.run(["kubectl", "kustomize", str(copy)], capture_output=True, text=True)
    if run.returncode != 0:
        errors.append(f"{what}: kubectl kustomize failed: {run.stderr.strip()}")
        return None
    return [d for d in yaml.load_all(run.stdout, Loader=StrictLoader) if d]


def build_with_kubectl(egressd, kustomizations, manifests, edits, errors):
    """With kubectl at hand, each Kustomization builds as it is in git and with its components
    (each alone, all together in both orders); its ConfigMaps are the ones check_components
    made of the components, no local-config object is left, and every egressd config is valid
    in the volume the built Deployment mounts, with the built Secrets beside it."""
    if shutil.which("kubectl") is None:
        print("skip  kubectl kustomize: no kubectl on this machine")
        return 0
    checked = 0
    for directory, kust in kustomizations.items():
        if kust.get("kind") == "Component":
            continue
        base = configmaps_in(directory, manifests)
        for variant in [()] + component_variants(components_of(directory, kustomizations)):
            what = f"{directory}" + "".join(
                f" {'with' if i == 0 else 'and'} {c.name}/" for i, c in enumerate(variant)
            )
            docs = kustomize(directory, variant, kustomizations, what, errors)
            if docs is None:
                continue
            print(f"ok    kubectl kustomize {what}")
            expected = apply_components(base, [edits[c] for c in variant], what, [])
            for doc in docs:
                name = doc["metadata"]["name"]
                if LOCAL_CONFIG in (doc["metadata"].get("annotations") or {}):
                    errors.append(f"kubectl kustomize {what}: kept local-config {name_of(doc)}")
                elif doc.get("kind") == "ConfigMap" and name in expected:
                    if (doc.get("data") or {}) != expected[name]:
                        errors.append(
                            f"kubectl kustomize {what}: ConfigMap {name} differs from what "
                            "check_manifests.py made of the components and validated"
                        )
            built = {
                d["metadata"]["name"]: {
                    k: base64.b64decode(v) for k, v in (d.get("data") or {}).items()
                }
                for d in docs
                if d.get("kind") == "Secret"
            }
            checked += check_egressd_configs(
                egressd, [(f"kubectl kustomize {what}", docs)], set(built), built, errors
            )
    return checked


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
    known_secrets = generated_secrets | {
        d["metadata"]["name"] for _, docs in manifests for d in docs if d.get("kind") == "Secret"
    }
    checked = check_egressd_configs(egressd, manifests, known_secrets, {}, errors)
    edits = all_component_edits(kustomizations, manifests, errors)
    checked += check_components(egressd, kustomizations, manifests, edits, errors)
    check_image_tags(root, manifests, kustomizations, errors)
    checked += build_with_kubectl(egressd, kustomizations, manifests, edits, errors)
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
