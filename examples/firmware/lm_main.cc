// Greedy text generation on a microcontroller with TFLM, from the files that
// `python -m tflite_export lm.keras --calibration ids.npy --out lm.tflite
// --target tflm --c-array` writes: lm.cc (the model), lm.h (its declaration,
// ops and arena) and lm_decode.h (the decode step's contract). Build this file
// and lm.cc with TFLM; run it with token ids as arguments on a host (the
// prompt; token 1 without any).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lm.h"         // g_model; G_MODEL_OPS, G_MODEL_ARENA_BYTES(_32BIT)
#include "lm_decode.h"  // the contract: inputs, outputs, cache feeds
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/micro/system_setup.h"
#include "tensorflow/lite/schema/schema_generated.h"
#if defined(LM_DEBUG_LOG_CALLBACK)
// A board build (TFLM's cortex_m_generic target) hands MicroPrintf's text to
// a callback the firmware registers, and prints nothing without one: build
// with -DLM_DEBUG_LOG_CALLBACK to send it to stdout (semihosting with newlib's
// rdimon specs, or a UART that retargets _write). A host build needs neither.
#include "tensorflow/lite/micro/cortex_m_generic/debug_log_callback.h"
#endif

namespace {

#if defined(LM_DEBUG_LOG_CALLBACK)
void WriteLog(const char* text) { std::fputs(text, stdout); }
#endif

// The arena for this target's pointers: a 32-bit part (a Cortex-M) needs
// less than the 64-bit host the header's first figure was measured on.
constexpr int kArenaBytes =
    sizeof(void*) == 4 ? G_MODEL_ARENA_BYTES_32BIT : G_MODEL_ARENA_BYTES;
alignas(16) uint8_t arena[kArenaBytes];
int8_t caches[G_MODEL_CACHE_BYTES];  // the state between steps

// The interpreter, made once: the model's schema checked, its ops registered
// (each once), its tensors allocated. nullptr if any of it fails.
tflite::MicroInterpreter* MakeInterpreter() {
  const tflite::Model* model = tflite::GetModel(g_model);
  if (model->version() != TFLITE_SCHEMA_VERSION) {
    MicroPrintf("The model has schema version %d; this TFLM reads version %d.",
                static_cast<int>(model->version()), TFLITE_SCHEMA_VERSION);
    return nullptr;
  }
  static tflite::MicroMutableOpResolver<G_MODEL_NUM_OPS> ops;
#define REGISTER_OP(add) \
  if (ops.add() != kTfLiteOk) return nullptr;
  G_MODEL_OPS(REGISTER_OP)
#undef REGISTER_OP
  static tflite::MicroInterpreter interpreter(model, ops, arena, kArenaBytes);
  if (interpreter.AllocateTensors() != kTfLiteOk) {
    MicroPrintf("AllocateTensors failed (arena %d bytes).", kArenaBytes);
    return nullptr;
  }
  return &interpreter;
}

}  // namespace

// Greedy continuation of `prompt` (n ids); writes up to `max_new` ids to
// `out` and returns how many, or -1 on an error.
int Generate(const int32_t* prompt, int n, int32_t* out, int max_new) {
  static tflite::MicroInterpreter* const interpreter = MakeInterpreter();
  if (interpreter == nullptr || n < 1) return -1;
  if (!G_MODEL_STREAMS && n > G_MODEL_CACHE_LENGTH) return -1;
  for (int i = 0; i < n; ++i) {
    if (prompt[i] < 0 || prompt[i] >= G_MODEL_VOCAB_SIZE) return -1;
  }
  // 1. Every cache at real zero: its input's zero point.
  int8_t* state[G_MODEL_NUM_CACHES];
  int offset = 0;
  for (int c = 0; c < G_MODEL_NUM_CACHES; ++c) {
    const g_model_feed& feed = g_model_feeds[c];
    state[c] = caches + offset;
    std::memset(state[c], feed.input_zero_point, feed.bytes);
    offset += feed.bytes;
  }
  int produced = 0;
  int32_t token = prompt[0];
  // 5. A step that stops at its cache length ends there; a streaming one
  // (G_MODEL_STREAMS) writes over its oldest slots and runs on.
  for (int t = 0; (G_MODEL_STREAMS || t < G_MODEL_CACHE_LENGTH) && produced < max_new;
       ++t) {
    // 2. The token, its position and the caches in; one step.
    interpreter->input(G_MODEL_INPUT_TOKEN)->data.i32[0] = token;
    interpreter->input(G_MODEL_INPUT_INDEX)->data.i32[0] = t;
    for (int c = 0; c < G_MODEL_NUM_CACHES; ++c) {
      const g_model_feed& feed = g_model_feeds[c];
      std::memcpy(interpreter->input(feed.input)->data.int8, state[c], feed.bytes);
    }
    if (interpreter->Invoke() != kTfLiteOk) return -1;
    // 3. The next token: the prompt's while it lasts, then the model's.
    const int8_t* logits = interpreter->output(G_MODEL_OUTPUT_LOGITS)->data.int8;
    const int next = g_model_argmax(logits);
    // 4. The new caches into the state (copied or requantized), before any
    // input is written again (TFLM may share an input's memory with an output).
    for (int c = 0; c < G_MODEL_NUM_CACHES; ++c) {
      const g_model_feed& feed = g_model_feeds[c];
      g_model_feed_cache(&feed, interpreter->output(feed.output)->data.int8,
                         state[c]);
    }
    if (t + 1 < n) {
      token = prompt[t + 1];  // still reading the prompt
    } else {
      token = next;
      out[produced++] = next;
    }
  }
  return produced;
}

int main(int argc, char** argv) {
#if defined(LM_DEBUG_LOG_CALLBACK)
  RegisterDebugLogCallback(WriteLog);
#endif
  tflite::InitializeTarget();
  static int32_t prompt[G_MODEL_CACHE_LENGTH];
  int n = 0;
  for (int i = 1; i < argc && n < G_MODEL_CACHE_LENGTH; ++i) {
    prompt[n++] = std::atoi(argv[i]);
  }
  if (n == 0) prompt[n++] = 1;
  // As many new tokens as fill the cache (twice its length when streaming).
  const int max_new =
      G_MODEL_STREAMS ? 2 * G_MODEL_CACHE_LENGTH : G_MODEL_CACHE_LENGTH - n;
  static int32_t first[2 * G_MODEL_CACHE_LENGTH], again[2 * G_MODEL_CACHE_LENGTH];
  const int produced = Generate(prompt, n, first, max_new);
  if (produced < 0) {
    MicroPrintf("Generate failed.");
    return 1;
  }
  char line[16 * 12];  // 16 ids a line
  for (int start = 0; start < produced; start += 16) {
    int used = 0;
    for (int i = start; i < produced && i < start + 16; ++i) {
      used += std::snprintf(line + used, sizeof(line) - used, " %d",
                            static_cast<int>(first[i]));
    }
    MicroPrintf("tokens%s", line);
  }
  // A second call reuses the interpreter and starts from empty caches.
  const bool same = Generate(prompt, n, again, max_new) == produced &&
                    std::memcmp(first, again, produced * sizeof(int32_t)) == 0;
  MicroPrintf("generated %d tokens; a second run %s", produced,
              same ? "gave the same" : "DIFFERS");
  return same ? 0 : 1;
}
