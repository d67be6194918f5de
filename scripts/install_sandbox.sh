#!/usr/bin/env bash
# Best effort: install bubblewrap, the agent sandbox. Without it runs still work, unsandboxed,
# and run.json says so.
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }) \
    && echo "installed bubblewrap (agent sandbox)" && exit 0
fi
echo "note: bubblewrap (bwrap) is not installed; agents will run unsandboxed (recorded in run.json)." >&2
echo "      install it with your package manager, e.g. 'sudo apt-get install bubblewrap'." >&2
exit 0
