# Re-run extract -> build -> audit (the path of cudal2_rl.policy.build_check) on stored completions.
import json, sys
from pathlib import Path
from cudal2.core.build import BuildSpec, build_many
from cudal2.harness.audit import audit_build
from cudal2_rl.extract import extract
folder = Path(sys.argv[1])
files = sorted(folder.glob("[0-9][0-9]_*.txt"))
old = {i: r for i, r in enumerate(json.loads((folder / "check.json").read_text())["rows"])}
exts = [extract(f.read_text()) for f in files]
ok = [i for i, e in enumerate(exts) if e.ok]
res = build_many([BuildSpec(source=exts[i].source, arch="sm_90a", name="policy-check") for i in ok])
passed = 0
for i, br in zip(ok, res):
    a = audit_build(exts[i].source, br, "sm_90a", name=files[i].name) if br.ok else None
    passed += bool(a and a.ok)
    then = old[i].get("audit") or ("build_error" if old[i].get("built") is False else old[i]["verdict"])
    print(f"{files[i].name}: then {then}; now "
          + ("build_error" if not br.ok else a.verdict + (" " + "; ".join(a.reasons) if a.reasons else "")))
print(f"{passed}/{len(files)} pass today's audit ({len(ok)} extracted)")
