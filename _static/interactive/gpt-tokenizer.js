/* cl100k_base in the browser: the same pieces and token ids as tiktoken (chapter 1).
 *
 * Tokenizing is two steps.
 * 1. Split the text into pieces with cl100k's pattern. tiktoken writes it with possessive
 *    quantifiers (?+, ++, *+), which JavaScript lacks. Here none of them changes what matches:
 *    after each possessive part, either nothing can fail any more ([\r\n]* may match nothing), or
 *    giving characters back cannot help (a letter run cannot start on the non-letter that `?`
 *    gave back; whitespace given back by `\s+` is still not followed by the end of the text). So
 *    the plain greedy forms below match exactly the same pieces. `\s` is written as
 *    \p{White_Space}, Unicode's definition that tiktoken's regex engine uses (JavaScript's own
 *    `\s` also counts U+FEFF and misses U+0085), and `(?i:s)` also allows `ſ` (U+017F), which
 *    folds to `s` under Unicode case folding.
 * 2. Byte-pair merges inside each piece: start from the piece's UTF-8 bytes and keep merging the
 *    adjacent pair whose joined bytes have the lowest rank in the table, until no pair is in it.
 *    A token's id is its rank.
 *
 * The table (every cl100k token's bytes, in rank order) comes from tokenizer.js, written by
 * tools/export_web_model.py.
 */
(function (global) {
  "use strict";

  const { decodeBase64 } = global.GPTBook; // from gpt-common.js
  const S = "\\p{White_Space}";
  const NOT_S = "\\P{White_Space}";
  const PATTERN = new RegExp(
    [
      "'(?:[sS\\u017F]|[dD]|[mM]|[tT]|[lL][lL]|[vV][eE]|[rR][eE])",
      "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+",
      "\\p{N}{1,3}",
      ` ?[^${S}\\p{L}\\p{N}]+[\\r\\n]*`,
      `[${S}]+$`,
      `[${S}]*[\\r\\n]`,
      `[${S}]+(?!${NOT_S})`,
      `[${S}]`,
    ].join("|"),
    "gu",
  );

  /** The pieces of `text`, in order (their concatenation is `text`). */
  function split(text) {
    return Array.from(text.matchAll(PATTERN), (m) => m[0]);
  }

  /** Bytes as a string of char codes 0-255: a cheap, exact key for a Map. */
  function bytesKey(bytes, start, end) {
    let key = "";
    for (let i = start; i < end; i++) key += String.fromCharCode(bytes[i]);
    return key;
  }

  class BytePairTokenizer {
    /** `data`: {table: base64 of [length byte, bytes...] per token in rank order, n_tokens}. */
    constructor(data) {
      const table = decodeBase64(data.table);
      this.ranks = new Map(); // bytes key -> rank
      this.tokenBytes = []; // rank -> Uint8Array
      let at = 0;
      while (at < table.length) {
        const length = table[at];
        const bytes = table.subarray(at + 1, at + 1 + length);
        this.ranks.set(bytesKey(bytes, 0, length), this.tokenBytes.length);
        this.tokenBytes.push(bytes);
        at += 1 + length;
      }
      if (this.tokenBytes.length !== data.n_tokens) throw new Error("corrupt tokenizer table");
      this.encoder = new TextEncoder();
      this.decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true }); // keep a leading U+FEFF
    }

    /** Byte-pair merges of one piece's bytes -> token ids (ranks). */
    mergePiece(bytes) {
      const whole = this.ranks.get(bytesKey(bytes, 0, bytes.length));
      if (whole !== undefined) return [whole];
      // parts[i] = start of part i; merge the lowest-ranked adjacent pair until none is known
      const starts = Array.from({ length: bytes.length + 1 }, (_, i) => i);
      const rankOf = (i) =>
        i + 2 < starts.length
          ? this.ranks.get(bytesKey(bytes, starts[i], starts[i + 2])) ?? Infinity
          : Infinity;
      const pairRanks = starts.map((_, i) => rankOf(i));
      for (;;) {
        let best = Infinity;
        let at = -1;
        for (let i = 0; i < pairRanks.length; i++) {
          if (pairRanks[i] < best) [best, at] = [pairRanks[i], i];
        }
        if (at < 0) break;
        starts.splice(at + 1, 1);
        pairRanks.splice(at + 1, 1);
        pairRanks[at] = rankOf(at);
        if (at > 0) pairRanks[at - 1] = rankOf(at - 1);
      }
      const ids = [];
      for (let i = 0; i + 1 < starts.length; i++) {
        ids.push(this.ranks.get(bytesKey(bytes, starts[i], starts[i + 1])));
      }
      return ids;
    }

    /** Text -> cl100k ids, as tiktoken's `encode_ordinary`. */
    encode(text) {
      const ids = [];
      for (const piece of split(text)) ids.push(...this.mergePiece(this.encoder.encode(piece)));
      return ids;
    }

    /** cl100k ids -> text (bytes that do not form whole characters become U+FFFD). */
    decode(ids) {
      const parts = ids.map((id) => this.tokenBytes[id]);
      const bytes = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
      let at = 0;
      for (const p of parts) {
        bytes.set(p, at);
        at += p.length;
      }
      return this.decoder.decode(bytes);
    }

    /** One token, readable: spaces as ␣, newlines as ↵, tabs as ⇥ (as gptlib's token_strings). */
    tokenString(id) {
      return this.decoder
        .decode(this.tokenBytes[id])
        .replace(/ /g, "␣")
        .replace(/\n/g, "↵")
        .replace(/\t/g, "⇥");
    }
  }

  global.GPTBook = Object.assign(global.GPTBook || {}, { BytePairTokenizer, splitCl100k: split });
})(window);
