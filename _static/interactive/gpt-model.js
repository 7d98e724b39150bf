/* The book's GPT, forward pass only, in plain JavaScript (chapters 2 to 9, and 11's sampling).
 *
 * Every step is the one a chapter builds: token embedding (2), positions (3), queries, keys and
 * values split into heads (4), scores scaled by √d_k (5), causal mask and softmax (6), weighted
 * sum of the values and output projection (7), LayerNorm, residuals and the feed-forward network
 * (8), final LayerNorm and the output layer (9), temperature and top-k sampling (11).
 *
 * Vectors are Float64Arrays (JavaScript numbers are 64-bit; PyTorch works in float32, so the two
 * agree to about 1e-6). Matrices keep PyTorch's nn.Linear layout: W is (out, in), y = W x + b.
 * The weights come from model.js, written by tools/export_web_model.py.
 */
(function (global) {
  "use strict";

  const { softmax, decodeBase64 } = global.GPTBook; // from gpt-common.js

  function decodeFloat32(base64) {
    return new Float32Array(decodeBase64(base64).buffer); // little-endian, as every browser's platform is
  }

  /** y = W x + b for W of shape (out, in) stored row by row. */
  function linear(W, b, x, nOut) {
    const nIn = x.length;
    const y = new Float64Array(nOut);
    for (let o = 0; o < nOut; o++) {
      let sum = b ? b[o] : 0;
      const row = o * nIn;
      for (let i = 0; i < nIn; i++) sum += W[row + i] * x[i];
      y[o] = sum;
    }
    return y;
  }

  /** LayerNorm (chapter 8): mean 0, variance 1 (biased variance, as nn.LayerNorm), scale, shift. */
  function layerNorm(x, weight, bias, eps) {
    const n = x.length;
    let mean = 0;
    for (let i = 0; i < n; i++) mean += x[i];
    mean /= n;
    let variance = 0;
    for (let i = 0; i < n; i++) variance += (x[i] - mean) ** 2;
    variance /= n;
    const scale = 1 / Math.sqrt(variance + eps);
    const y = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      y[i] = (x[i] - mean) * scale * (weight ? weight[i] : 1) + (bias ? bias[i] : 0);
    }
    return y;
  }

  /** The sinusoidal table of chapter 3: PE[pos, 2i] = sin(pos ω_i), PE[pos, 2i+1] = cos(pos ω_i). */
  function sinusoidalPosition(pos, dModel, base = 10000) {
    const pe = new Float64Array(dModel);
    for (let i = 0; i < dModel; i += 2) {
      const angle = pos / base ** (i / dModel);
      pe[i] = Math.sin(angle);
      pe[i + 1] = Math.cos(angle);
    }
    return pe;
  }

  const ACTIVATIONS = {
    relu: (v) => Math.max(0, v),
    gelu: (v) => 0.5 * v * (1 + erf(v / Math.SQRT2)),
    gelu_tanh: (v) => 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3))),
  };

  /** erf, for the exact GELU: a Taylor series below 2.5, a continued fraction above. Against
   * Python's math.erf on [-8, 8] it is within 1e-14; the usual short formula, Abramowitz & Stegun
   * 7.1.26, is off by up to 1.5e-7, the size of float32's own rounding, which this page's
   * float64 arithmetic otherwise avoids. */
  function erf(x) {
    const sign = x < 0 ? -1 : 1;
    const a = Math.abs(x);
    if (a < 2.5) {
      // Taylor series: erf(a) = 2/√π Σ (-1)^n a^(2n+1) / (n! (2n+1))
      let term = a;
      let sum = a;
      for (let n = 1; n < 60; n++) {
        term *= (-a * a) / n;
        sum += term / (2 * n + 1);
      }
      return (sign * 2 * sum) / Math.sqrt(Math.PI);
    }
    // continued fraction for erfc, accurate for large a
    let f = 0;
    for (let n = 60; n >= 1; n--) f = n / 2 / (a + f);
    const erfc = Math.exp(-a * a) / Math.sqrt(Math.PI) / (a + f);
    return sign * (1 - erfc);
  }

  class GPTModel {
    /** `data`: the object model.js assigns to window.gptWebModel. */
    constructor(data) {
      this.config = data.config;
      this.vocabIds = data.vocab_ids; // model id -> cl100k id, or null (the ids are cl100k's)
      const all = decodeFloat32(data.weights);
      this.weights = {};
      for (const t of data.tensors) {
        const size = t.shape.reduce((n, d) => n * d, 1);
        this.weights[t.name] = all.subarray(t.offset, t.offset + size);
      }
      if (this.vocabIds) this.modelIdOf = new Map(this.vocabIds.map((id, k) => [id, k]));
      // model ids whose embedding row never got a gradient (absent from older exports)
      this.unread = new Set(data.unread_ids || []);
    }

    /** True when training never read this token as an input: its vector is still the random one
     * it started with, only shrunk by weight decay. */
    isUnread(modelId) {
      return this.unread.has(modelId);
    }

    w(name) {
      return this.weights[name] || null; // null for a bias the config switched off
    }

    /** cl100k id -> model id (undefined when the model never saw that token). */
    toModelId(cl100kId) {
      return this.vocabIds ? this.modelIdOf.get(cl100kId) : cl100kId;
    }

    toCl100kId(modelId) {
      return this.vocabIds ? this.vocabIds[modelId] : modelId;
    }

    /** Chapters 2-3: token vector (times sqrt(d_model) when the config says so, as in chapter 3)
     * + position vector, for each position. */
    embed(ids) {
      const C = this.config.d_model;
      const table = this.w("token_embedding.weight");
      const scale = this.config.scale_embeddings ? Math.sqrt(C) : 1;
      return ids.map((id, pos) => {
        const x = Float64Array.from(table.subarray(id * C, (id + 1) * C), (v) => v * scale);
        const p =
          this.config.positions === "learned"
            ? this.w("position_embedding.weight").subarray(pos * C, (pos + 1) * C)
            : sinusoidalPosition(pos, C);
        for (let i = 0; i < C; i++) x[i] += p[i];
        return x;
      });
    }

    /** Chapters 4-7: causal multi-head self-attention over xs (one vector per token).
     * Returns the outputs and, when keepWeights, the weights [head][query][key] (else null). */
    attention(prefix, xs, keepWeights = true) {
      const { d_model: C, n_heads: H } = this.config;
      const hs = C / H;
      const project = (name, x) => linear(this.w(`${prefix}.${name}.weight`), this.w(`${prefix}.${name}.bias`), x, C);
      const q = xs.map((x) => project("W_q", x));
      const k = xs.map((x) => project("W_k", x));
      const v = xs.map((x) => project("W_v", x));
      const T = xs.length;
      const weights = keepWeights ? [] : null;
      const merged = xs.map(() => new Float64Array(C));
      for (let h = 0; h < H; h++) {
        const lo = h * hs;
        const headWeights = keepWeights ? [] : null;
        for (let i = 0; i < T; i++) {
          const scores = new Float64Array(i + 1); // keys 0..i: the causal mask (chapter 6)
          for (let j = 0; j <= i; j++) {
            let dot = 0;
            for (let c = lo; c < lo + hs; c++) dot += q[i][c] * k[j][c];
            scores[j] = dot / Math.sqrt(hs); // chapter 5's scaling
          }
          const w = softmax(scores);
          for (let j = 0; j <= i; j++) {
            for (let c = lo; c < lo + hs; c++) merged[i][c] += w[j] * v[j][c];
          }
          if (keepWeights) {
            const row = new Float64Array(T); // masked keys get weight 0
            row.set(w);
            headWeights.push(row);
          }
        }
        if (keepWeights) weights.push(headWeights);
      }
      const out = merged.map((m) => linear(this.w(`${prefix}.W_o.weight`), this.w(`${prefix}.W_o.bias`), m, C));
      return { out, weights };
    }

    /** Chapter 8: Linear -> activation -> Linear, on one vector. */
    feedForward(prefix, x) {
      const { d_model: C, d_ff: dFF } = this.config;
      const hidden = linear(this.w(`${prefix}.linear1.weight`), this.w(`${prefix}.linear1.bias`), x, dFF);
      const act = ACTIVATIONS[this.config.activation];
      for (let i = 0; i < hidden.length; i++) hidden[i] = act(hidden[i]);
      return linear(this.w(`${prefix}.linear2.weight`), this.w(`${prefix}.linear2.bias`), hidden, C);
    }

    /** Chapter 8: one block, pre-LN (x + f(LN(x))) or post-LN (LN(x + f(x))). */
    block(b, xs, keepWeights = true) {
      const p = `blocks.${b}`;
      const eps = this.config.norm_eps;
      const ln = (name, x) => layerNorm(x, this.w(`${p}.${name}.weight`), this.w(`${p}.${name}.bias`), eps);
      const add = (a, c) => a.map((v, i) => v + c[i]);
      if (this.config.norm_placement === "post") {
        const { out, weights } = this.attention(`${p}.attn`, xs, keepWeights);
        const ys = xs.map((x, t) => ln("ln1", add(x, out[t])));
        return { xs: ys.map((y) => ln("ln2", add(y, this.feedForward(`${p}.ffn`, y)))), weights };
      }
      const { out, weights } = this.attention(`${p}.attn`, xs.map((x) => ln("ln1", x)), keepWeights);
      const ys = xs.map((x, t) => add(x, out[t]));
      return { xs: ys.map((y) => add(y, this.feedForward(`${p}.ffn`, ln("ln2", y)))), weights };
    }

    /** Model ids (at most context_length) -> logits of every position (only the last one with
     * lastOnly) and every block's attention weights [block][head][query][key] (null with
     * attention: false, which saves building maps nobody looks at). */
    forward(ids, { lastOnly = false, attention: keepWeights = true } = {}) {
      const { n_blocks: nBlocks, context_length: T, vocab_size: V, norm_eps: eps } = this.config;
      if (ids.length < 1 || ids.length > T) throw new Error(`give 1 to ${T} tokens, not ${ids.length}`);
      let xs = this.embed(ids);
      const attention = keepWeights ? [] : null;
      for (let b = 0; b < nBlocks; b++) {
        const result = this.block(b, xs, keepWeights);
        xs = result.xs;
        if (keepWeights) attention.push(result.weights);
      }
      if (this.config.final_norm) {
        xs = xs.map((x) => layerNorm(x, this.w("final_norm.weight"), this.w("final_norm.bias"), eps));
      }
      if (lastOnly) xs = xs.slice(-1); // generation needs only the last position's logits
      const logits = xs.map((x) => linear(this.w("lm_head.weight"), null, x, V));
      return { logits, attention };
    }

    /** Logits for the next token after `ids` (the last context_length of them); generation
     * needs no attention maps. */
    nextLogits(ids) {
      const window = ids.slice(-this.config.context_length);
      const { logits } = this.forward(window, { lastOnly: true, attention: false });
      return logits[logits.length - 1];
    }

    /** Chapter 11's sampling: `steps` new ids after `ids`; temperature 0 = always the most likely;
     * topK 0 = the whole vocabulary. `random()` returns numbers in [0, 1). */
    generate(ids, steps, { temperature = 1, topK = 0, random = Math.random } = {}) {
      const out = ids.slice();
      for (let s = 0; s < steps; s++) {
        out.push(sampleNext(this.nextLogits(out), temperature, topK, random));
      }
      return out.slice(ids.length);
    }
  }

  /** One id from logits: greedy at temperature 0, else softmax(logits / T) over the top k. */
  function sampleNext(logits, temperature, topK, random) {
    let order = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a]);
    if (temperature <= 0) return order[0];
    if (topK > 0) order = order.slice(0, topK);
    const probs = softmax(order.map((i) => logits[i]), temperature);
    let r = random();
    for (let n = 0; n < order.length; n++) {
      r -= probs[n];
      if (r < 0) return order[n];
    }
    return order[order.length - 1];
  }

  /** A small seeded random generator (mulberry32), so a seed gives the same text every time. */
  function seededRandom(seed) {
    let a = seed >>> 0;
    return function () {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  global.GPTBook = Object.assign(global.GPTBook || {}, {
    GPTModel,
    sinusoidalPosition,
    seededRandom,
    sampleNext,
  });
})(window);
