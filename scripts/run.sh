#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, build the CPU engine and serve the small
# trained model in ../shared/testdata over the OpenAI-compatible API (no GPU needed). Extra arguments are
# passed to `inferx serve` (e.g. --port 9000 --host 0.0.0.0). INFERX_MODEL picks another model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target inferx
model="${INFERX_MODEL:-../shared/testdata/stories260K.gguf}"
[ -e "$model" ] || [[ "$model" == dummy:* ]] || model="dummy:tiny"
port=8000
extra=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[$i]}" = "--port" ] && [ $((i + 1)) -lt ${#args[@]} ]; then port="${args[$((i + 1))]}"; fi
done
[[ " $* " == *" --port "* ]] || extra+=(--port "$port")
template=../shared/testdata/chat_templates/Qwen-Qwen3-0.6B.jinja  # stories260K ships no chat template
if [[ "$model" == *stories260K* ]] && [ -f "$template" ]; then extra+=(--chat-template "$template"); fi
name=$(basename "$model" .gguf)
cat <<MSG
== inferx serve: http://127.0.0.1:${port}  (model ${name}; Ctrl-C drains and stops)
   curl http://127.0.0.1:${port}/v1/completions -H 'Content-Type: application/json' \\
     -d '{"model": "${name}", "prompt": "Once upon a time", "max_tokens": 64}'
   curl http://127.0.0.1:${port}/v1/chat/completions -H 'Content-Type: application/json' \\
     -d '{"model": "${name}", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 64}'
MSG
exec build/cpu/src/cli/inferx serve --model "$model" "${extra[@]}" "$@"
