# The wheels a device machine lacks, for the scripts/gpu_*.sh commands: sourced, not run.
#
# The device machine has its own CUDA torch and no network, so a script's --prepare step downloads the
# wheels it needs HERE into .whl/ (carried there with run(carry=[".whl"])) and its main step installs
# them THERE into /tmp/site. PY is the Python to use (the caller sets it).

# ignore_locally PATH...: list each PATH (e.g. /.whl/) in this clone's own git exclude file, so that the
# prepared folders stay untracked without touching .gitignore.
ignore_locally() {
    local exclude
    exclude="$(git rev-parse --git-common-dir)/info/exclude"
    for d in "$@"; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
}

# download_wheels SPEC...: the binary wheels of SPEC (pinned, no dependencies) for the device's Python
# 3.12 on x86-64 Linux, into .whl/.
download_wheels() {
    ignore_locally /.whl/
    mkdir -p .whl
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "$@"
}

# install_wheels: the carried .whl/ (when there is one) installed into /tmp/site, which goes at the end
# of PYTHONPATH (after this checkout, so its hessviz is the one imported).
install_wheels() {
    if [[ -d .whl ]]; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
    fi
}
