# Sourced by the device scripts (gpu_check.sh, ncu_check.sh): makes graphtop importable on the device
# without pip or network, and installs the carried wheels. Expects $here (the repository root).
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONUNBUFFERED=1

# graphtop.* maps onto the top-level folders; a symlink shim does that without pip or network.
shim=/tmp/graphtop-shim
rm -rf "$shim" && mkdir -p "$shim/graphtop"
for pkg in engine models tui themes server cli; do ln -s "$here/$pkg" "$shim/graphtop/$pkg"; done
export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
# Packages the GPU machine's image lacks travel as wheels in .whl (docs/development.md): textual & co. (pure python),
# pyzmq and msgspec (cp312 manylinux x86_64).
if [ -d "$here/.whl" ] && ls "$here"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/whl-site \
    "$here"/.whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/whl-site"
fi
