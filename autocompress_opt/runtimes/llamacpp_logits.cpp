// autocompress-logits: next-token logits of a GGUF model for given token ids, through llama.cpp's C API.
//
// Built by .ci/install_engines.sh against the llama.cpp it builds (build/llama.cpp/build/bin).
// serve-check feeds the same token ids to transformers and to this tool, so tokenisation plays no
// part in the comparison.
//
// usage: autocompress-logits MODEL.gguf IN.bin OUT.bin [THREADS]
//   IN.bin : int32 n_seqs, then per sequence int32 n_tokens and n_tokens int32 token ids
//   OUT.bin: int32 n_vocab, then per sequence n_tokens x n_vocab float32 logits (row t predicts token t+1)
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static bool read_i32(FILE * f, int32_t & v) { return fread(&v, sizeof v, 1, f) == 1; }

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IN.bin OUT.bin [THREADS]\n", argv[0]);
        return 2;
    }
    const int threads = argc > 4 ? atoi(argv[4]) : 2;
    FILE * in = fopen(argv[2], "rb");
    if (!in) { fprintf(stderr, "cannot open %s\n", argv[2]); return 2; }
    int32_t n_seqs = 0;
    std::vector<std::vector<int32_t>> seqs;
    if (!read_i32(in, n_seqs) || n_seqs < 0) { fprintf(stderr, "bad input header\n"); return 2; }
    int32_t longest = 1;
    for (int32_t s = 0; s < n_seqs; ++s) {
        int32_t n = 0;
        if (!read_i32(in, n) || n <= 0) { fprintf(stderr, "bad sequence %d\n", s); return 2; }
        std::vector<int32_t> ids(n);
        if (fread(ids.data(), sizeof(int32_t), n, in) != (size_t) n) { fprintf(stderr, "short sequence %d\n", s); return 2; }
        longest = n > longest ? n : longest;
        seqs.push_back(std::move(ids));
    }
    fclose(in);

    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (!model) { fprintf(stderr, "cannot load model %s\n", argv[1]); return 1; }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) longest;
    cparams.n_batch = (uint32_t) longest;
    cparams.n_ubatch = (uint32_t) longest;
    cparams.n_seq_max = 1;
    cparams.n_threads = threads;
    cparams.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }

    FILE * out = fopen(argv[3], "wb");
    if (!out) { fprintf(stderr, "cannot write %s\n", argv[3]); return 2; }
    fwrite(&n_vocab, sizeof n_vocab, 1, out);
    llama_batch batch = llama_batch_init(longest, 0, 1);
    for (const auto & ids : seqs) {
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = (int32_t) ids.size();
        for (int32_t t = 0; t < batch.n_tokens; ++t) {
            batch.token[t] = ids[t];
            batch.pos[t] = t;
            batch.n_seq_id[t] = 1;
            batch.seq_id[t][0] = 0;
            batch.logits[t] = 1;  // every position's next-token logits
        }
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_decode failed\n"); return 1; }
        for (int32_t t = 0; t < batch.n_tokens; ++t) {
            fwrite(llama_get_logits_ith(ctx, t), sizeof(float), (size_t) n_vocab, out);
        }
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
