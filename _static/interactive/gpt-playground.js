/* "Try the model": the model trained in chapter 10b, running in the page.
 *
 * The page holds an empty <div id="gpt-playground">. This script loads the exported model
 * (../web-model/model.js and tokenizer.js, next to this file's folder, written when the book is
 * built) with <script> tags, which also work when the book is opened from a folder on disk, and
 * then builds the panels: tokens, attention weights, next-token probabilities and generation.
 * Everything is computed in the browser by gpt-tokenizer.js and gpt-model.js.
 *
 * A prompt may hold tokens outside the model's vocabulary (which holds only its corpus's tokens).
 * They are named, struck through and left out; the model runs on the tokens it knows.
 */
(function (global) {
  "use strict";

  const book = global.GPTBook;
  const { el, svgEl } = book; // from gpt-common.js
  const here = document.currentScript ? document.currentScript.src : "";
  // Prompts a reader can click. The last one holds a word the sales textbook never uses
  // ("␣asked"), to show how such tokens are left out.
  const EXAMPLES = [
    "A good salesperson builds trust with the customer",
    "The key to successful selling is",
    "When a customer says no,",
    "The salesperson asked the customer about",
  ];
  // What the book's own corpus is called in the exported model, and how the page names it.
  const BOOK_CORPUS = "sales-textbook";
  const MAX_NEW_TOKENS = 200;
  const TOKENS_PER_CHUNK = 5; // generation hands the page back to the browser this often
  // the heatmap's caption, which the drawing is at least as wide as (12 px text)
  const AXIS_CAPTION = "rows: query token · columns: key token";
  const AXIS_CAPTION_WIDTH = 250;

  /** "1 token", "5 tokens". */
  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  /** The number in an <input type=number>, clamped to [lo, hi] (a whole number with `whole`); the
   * field is rewritten, so the reader sees the value that is used. Empty or not a number: `fallback`. */
  function clampField(input, lo, hi, fallback, whole = true) {
    let value = Number(input.value);
    if (input.value.trim() === "" || !Number.isFinite(value)) value = fallback;
    if (whole) value = Math.round(value);
    value = Math.max(lo, Math.min(hi, value));
    if (String(value) !== input.value) input.value = String(value);
    return value;
  }

  /** How the page names the corpus the model was trained on: the `corpus` field of the exported
   * model (a named corpus's title such as "the sales textbook", its name, or a file's name; at the
   * top level, or in a `metadata` object), or the book's own corpus when an older export has none. */
  function corpusName(data) {
    const given = data.corpus ?? (data.metadata && data.metadata.corpus);
    const corpus = typeof given === "string" ? given.trim() : "";
    if (!corpus || corpus === BOOK_CORPUS) return "the sales textbook";
    if (corpus.startsWith("the ")) return corpus; // already a title
    return `the text “${corpus.split(/[\\/]/).pop()}”`;
  }

  function loadScript(url) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`could not load ${url}`));
      document.head.appendChild(script);
    });
  }

  /** Is the site in dark mode? (the theme sets data-theme on <html>) */
  function darkTheme() {
    return document.documentElement.dataset.theme === "dark";
  }

  /** The colour of an attention weight in [0, 1]: the more weight, the more the cell stands out. Light
   * mode: white -> dark blue; dark mode: dark navy -> light blue, so that in both the heavy cells
   * stand out from the page. */
  function weightColour(w, dark = darkTheme()) {
    const t = Math.max(0, Math.min(1, w));
    const mix = (a, b) => Math.round(a + (b - a) * t);
    if (dark) return `rgb(${mix(22, 150)}, ${mix(36, 205)}, ${mix(56, 255)})`;
    return `rgb(${mix(255, 8)}, ${mix(255, 48)}, ${mix(255, 107)})`;
  }

  /** The colour key, in the free top-left corner of the heatmap: a 0 -> 1 ramp and the masked grey. */
  function drawKey(svg, dark) {
    const gradient = svgEl("linearGradient", { id: "gptp-weight-ramp" });
    for (let k = 0; k <= 4; k++) {
      gradient.append(svgEl("stop", { offset: `${k * 25}%`, "stop-color": weightColour(k / 4, dark) }));
    }
    const defs = svgEl("defs");
    defs.append(gradient);
    svg.append(defs);
    const label = (x, y, text, anchor = "start") =>
      svgEl("text", { x, y, "font-size": 12, fill: "currentColor", "text-anchor": anchor, class: "gptp-key" }, text);
    svg.append(
      label(4, 40, "weight"),
      svgEl("rect", { x: 4, y: 46, width: 80, height: 10, fill: "url(#gptp-weight-ramp)", stroke: "currentColor", "stroke-width": 0.5, class: "gptp-key" }),
      label(4, 70, "0"),
      label(84, 70, "1", "end"),
      svgEl("rect", { x: 4, y: 80, width: 10, height: 10, fill: "#eeeeee", class: "gptp-masked gptp-key" }),
      label(18, 89, "masked"),
    );
  }

  function shortLabel(s, n = 12) {
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  /** What a cell of the heatmap says: its query and key tokens, with their positions, and its
   * weight to three decimals. */
  function cellText(labels, i, j, w) {
    return `row ${i} “${labels[i]}” → column ${j} “${labels[j]}”: ${w.toFixed(3)}`;
  }

  /** The attention weights of one head as a T x T heatmap with token labels. The SVG keeps its
   * natural size (labels 12 px, cell numbers 11 px): on a narrow screen its box scrolls sideways.
   * Text takes the page's colour (currentColor), so the labels read in light and dark mode. Each
   * visible cell holds its row and column (data-i, data-j); the numbers drawn on the cells let
   * the pointer through to them (pointer-events: none), so hovering anywhere on a cell shows its
   * title. */
  function drawAttention(svg, weights, labels, name) {
    svg.replaceChildren();
    svg.setAttribute("aria-label", name);
    const dark = darkTheme();
    const T = labels.length;
    const cell = Math.max(18, Math.min(34, Math.floor(480 / T)));
    const margin = 110;
    const shown = labels.map((label) => shortLabel(label));
    // a column label is turned by -60°: it reaches cos 60° = 0.5 of its length to the right of its
    // anchor (about 7.5 px a character at 12 px), past the last column's centre
    const longest = Math.max(...shown.map((label) => label.length));
    const width = Math.max(AXIS_CAPTION_WIDTH, margin + T * cell - cell / 2 + Math.ceil(0.5 * 7.5 * longest) + 12);
    const height = margin + T * cell + 10;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        const w = weights[i][j];
        const rect = svgEl("rect", {
          x: margin + j * cell,
          y: margin + i * cell,
          width: cell - 1,
          height: cell - 1,
          fill: j > i ? "#eeeeee" : weightColour(w, dark),
        });
        if (j > i) rect.setAttribute("class", "gptp-masked"); // its colour follows the theme (CSS)
        else Object.assign(rect.dataset, { i, j });
        const title = svgEl("title");
        title.textContent = j > i ? "masked (a future token)" : cellText(labels, i, j, w);
        rect.append(title);
        svg.append(rect);
        if (j <= i && cell >= 26) {
          const text = svgEl("text", {
            x: margin + j * cell + cell / 2,
            y: margin + i * cell + cell / 2 + 4,
            "text-anchor": "middle",
            "font-size": 11,
            fill: (w > 0.55) !== dark ? "white" : "#222",
            "pointer-events": "none",
          });
          text.textContent = w.toFixed(2).replace(/^0/, "");
          svg.append(text);
        }
      }
      const rowLabel = svgEl("text", { x: margin - 6, y: margin + i * cell + cell / 2 + 4, "text-anchor": "end", "font-size": 12, fill: "currentColor" });
      rowLabel.textContent = shown[i];
      svg.append(rowLabel);
      const x = margin + i * cell + cell / 2;
      const colLabel = svgEl("text", { x, y: margin - 6, "text-anchor": "start", "font-size": 12, fill: "currentColor", transform: `rotate(-60 ${x} ${margin - 6})` });
      colLabel.textContent = shown[i];
      svg.append(colLabel);
    }
    const axis = svgEl("text", { x: 4, y: 14, "font-size": 12, fill: "currentColor", class: "gptp-axis" });
    axis.textContent = AXIS_CAPTION;
    svg.append(axis);
    drawKey(svg, dark);
  }

  /** Mean weight on the previous token over the rows that have one (rows 1 to T-1), as the
   * appendix *After training* measures it; and what an even spread would give: 1/(i+1) in row i. */
  function previousTokenShare(weights) {
    const T = weights.length;
    let share = 0;
    let even = 0;
    for (let i = 1; i < T; i++) {
      share += weights[i][i - 1];
      even += 1 / (i + 1);
    }
    return { share: share / (T - 1), even: even / (T - 1) };
  }

  class Playground {
    constructor(root, model, tokenizer, about) {
      this.root = root;
      this.model = model;
      this.tokenizer = tokenizer;
      this.about = about; // {corpus, parameters, step}: what the exported model says of itself
      this.result = null; // the last analysed prompt, for the panels (and the book's tests)
      this.timings = {};
      this.build();
    }

    build() {
      const { n_blocks: nBlocks, n_heads: nHeads, context_length: T, vocab_size: V } = this.model.config;
      const option = (i) => el("option", { value: i }, String(i));
      this.prompt = el("textarea", { id: "gptp-prompt", rows: 2, spellcheck: "false" });
      this.prompt.value = EXAMPLES[0];
      const examples = EXAMPLES.map((text) => {
        const button = el("button", { type: "button", class: "gptp-example" }, text);
        button.addEventListener("click", () => {
          this.prompt.value = text;
          this.update();
        });
        return button;
      });
      const { corpus, parameters, step } = this.about;
      const trained = step ? ` for ${step.toLocaleString("en")} steps` : "";
      this.tokens = el("div", { id: "gptp-tokens", class: "gptp-tokens" });
      this.unknown = el("div", { id: "gptp-unknown", class: "gptp-message", hidden: "" });
      this.blockSelect = el("select", { id: "gptp-block" }, ...Array.from({ length: nBlocks }, (_, i) => option(i)));
      this.headSelect = el("select", { id: "gptp-head" }, ...Array.from({ length: nHeads }, (_, i) => option(i)));
      this.attention = svgEl("svg", { id: "gptp-attention", class: "gptp-attention", role: "img" });
      this.cell = el("p", { id: "gptp-cell", class: "gptp-note" });
      this.previous = el("p", { id: "gptp-previous", class: "gptp-note" });
      // the slider holds log10 of the temperature: 0.1 at the left end, 1 in the middle, 10 at the right
      this.temperature = el("input", { id: "gptp-temperature", type: "range", min: -1, max: 1, step: 0.05, value: 0 });
      this.temperatureValue = el("output", { id: "gptp-temperature-value" });
      this.nextAbout = el("p", { id: "gptp-next-about", class: "gptp-note" });
      this.next = el("table", { id: "gptp-next", class: "gptp-next" });
      this.steps = el("input", { id: "gptp-steps", type: "number", min: 1, max: MAX_NEW_TOKENS, value: 30 });
      this.genTemperature = el("input", { id: "gptp-gen-temperature", type: "number", min: 0, max: 3, step: 0.1, value: 0.8 });
      this.topK = el("input", { id: "gptp-topk", type: "number", min: 0, max: V, value: 10, title: `0: no cut, all ${V.toLocaleString("en")} tokens can be drawn` });
      this.seed = el("input", { id: "gptp-seed", type: "number", min: 0, value: 1 });
      this.generateButton = el("button", { id: "gptp-generate", type: "button" }, "Generate");
      this.output = el("div", { id: "gptp-output", class: "gptp-output" });
      this.legend = el("p", { class: "gptp-note" },
        "Grey: your prompt (struck through: left out, faded: outside the window); bold: what the model wrote.");
      this.timing = el("div", { id: "gptp-timing", class: "gptp-note" });

      const section = (title, ...children) => el("section", { class: "gptp-panel" }, el("h3", {}, title), ...children);
      this.root.replaceChildren(
        section(
          "1. Your prompt and its tokens",
          el("p", { id: "gptp-about", class: "gptp-note" },
            `A model of ${parameters.toLocaleString("en")} parameters, trained${trained} on ${corpus}.`),
          el("div", { id: "gptp-examples", class: "gptp-examples" }, "Try an example: ", ...examples),
          el("label", { for: "gptp-prompt" }, `Or type some text, with no space at the end (the model reads the last ${T} tokens it knows):`),
          this.prompt,
          this.tokens,
          this.unknown,
        ),
        section(
          "2. Attention weights",
          el("div", { class: "gptp-controls" },
            el("label", {}, `block (of ${nBlocks}) `, this.blockSelect),
            el("label", {}, `head (of ${nHeads}) `, this.headSelect)),
          el("div", { class: "gptp-scroll" }, this.attention),
          this.cell,
          this.previous,
        ),
        section(
          "3. The next token",
          el("div", { class: "gptp-controls" },
            el("label", { for: "gptp-temperature" }, "temperature (this table only) "),
            el("span", { class: "gptp-range" }, el("span", { class: "gptp-note" }, "0.1"), this.temperature, el("span", { class: "gptp-note" }, "10")),
            el("span", {}, "τ = ", this.temperatureValue)),
          this.nextAbout,
          this.next,
        ),
        section(
          "4. Generate a continuation",
          el("div", { class: "gptp-controls" },
            el("label", {}, `new tokens (1–${MAX_NEW_TOKENS}) `, this.steps),
            el("label", {}, "sampling temperature (0: greedy, at most 3) ", this.genTemperature),
            el("label", {}, "top-k (0: no cut) ", this.topK),
            el("label", {}, "seed ", this.seed),
            this.generateButton),
          this.output,
          this.legend,
          this.timing,
        ),
      );
      this.prompt.addEventListener("input", () => this.update());
      this.blockSelect.addEventListener("change", () => this.showAttention());
      this.headSelect.addEventListener("change", () => this.showAttention());
      this.temperature.addEventListener("input", () => this.showNext());
      // a cell's weight under the map: on hover with a mouse, on a tap on a touch screen
      const showCell = (event) => {
        const rect = event.target.closest && event.target.closest("rect[data-i]");
        if (!rect || !this.shownWeights) return;
        const [i, j] = [Number(rect.dataset.i), Number(rect.dataset.j)];
        this.cell.textContent = cellText(this.shownLabels, i, j, this.shownWeights[i][j]);
      };
      this.attention.addEventListener("pointerover", showCell);
      this.attention.addEventListener("click", showCell);
      // the site's light/dark switch: redraw the map in the other colours
      new MutationObserver(() => this.showAttention()).observe(document.documentElement, {
        attributes: true,
        attributeFilter: ["data-theme"],
      });
      this.generateButton.addEventListener("click", () => this.generate());
    }

    get temperatureNow() {
      return 10 ** Number(this.temperature.value);
    }

    /** Tokenize the prompt, leave out the tokens the model does not know, run the model on the
     * last context_length of the others, refresh the panels. */
    analyse(text) {
      const started = performance.now();
      const cl100k = this.tokenizer.encode(text);
      const tokens = cl100k.map((id) => ({
        cl100k: id,
        model: this.model.toModelId(id),
        text: this.tokenizer.tokenString(id),
      }));
      const unknown = tokens.filter((t) => t.model === undefined);
      const known = tokens.filter((t) => t.model !== undefined);
      const result = { text, tokens, unknown, known, window: [], logits: null, attention: null };
      if (known.length) {
        const T = this.model.config.context_length;
        result.window = known.slice(-T);
        const out = this.model.forward(result.window.map((t) => t.model));
        result.logits = out.logits.map((row) => Array.from(row));
        result.attention = out.attention;
      }
      result.ms = performance.now() - started;
      return result;
    }

    update() {
      this.result = this.analyse(this.prompt.value);
      this.stopGenerating(); // a continuation of the previous prompt would mislead
      this.output.replaceChildren();
      this.timing.textContent = "";
      this.showTokens();
      this.showAttention();
      this.showNext();
      this.root.dataset.updates = String(Number(this.root.dataset.updates || 0) + 1);
    }

    showTokens() {
      const { tokens, unknown, known, window } = this.result;
      const read = new Set(window); // the known tokens inside the context window
      this.tokens.replaceChildren(
        ...tokens.map((t) => {
          const isUnknown = t.model === undefined;
          let kind = "";
          const isUnread = !isUnknown && this.model.isUnread(t.model);
          if (isUnknown) kind = " gptp-unknown";
          else if (!read.has(t)) kind = " gptp-outside"; // known, but before the window
          if (isUnread) kind += " gptp-unread";
          return el(
            "span",
            {
              class: "gptp-token" + kind,
              "data-cl100k": t.cl100k,
              "data-model": isUnknown ? "" : t.model,
              title: isUnknown
                ? "not in the model's vocabulary: left out"
                : `cl100k id ${t.cl100k}, model id ${t.model}` +
                  (isUnread ? ": never read in training, so its vector is still random (only shrunk)" : ""),
            },
            el(isUnknown ? "del" : "span", { class: "gptp-token-text" }, t.text),
            el("span", { class: "gptp-token-id" }, isUnknown ? `${t.cl100k} · left out` : `${t.cl100k} · ${t.model}`),
          );
        }),
      );
      if (!tokens.length) {
        this.showMessage("Type at least one word, or click an example, to see what the model makes of it.");
        return;
      }
      const notes = [];
      if (unknown.length) {
        const names = [...new Set(unknown.map((t) => `“${t.text}” (cl100k id ${t.cl100k})`))];
        const one = names.length === 1;
        const T = this.model.config.context_length;
        const others = plural(known.length, "other token");
        const leftOut = known.length
          ? `${one ? "It is" : "They are"} struck through above and left out: the model reads ` +
            (known.length > T ? `the last ${T} of the ${others}: ` : `the ${others}: `) +
            `${this.readTokens()}.`
          : "No token of this prompt is left to read: rephrase it, or click an example.";
        notes.push(
          `${one ? "This token is" : "These tokens are"} not in the model's vocabulary: ${names.join(", ")}. ` +
            `The vocabulary holds only the tokens of ${this.about.corpus}, so the model has no vector ` +
            `for ${one ? "it" : "them"} (chapter 1). ` + leftOut + this.spaceHint(),
        );
      }
      const unread = [...new Set(window.filter((t) => this.model.isUnread(t.model)).map((t) => `“${t.text}”`))];
      if (unread.length) {
        const one = unread.length === 1;
        notes.push(
          `${unread.join(", ")} ${one ? "is" : "are"} in the vocabulary, but training never read ` +
            `${one ? "it" : "them"} (dashed border): the model reads ${one ? "it" : "them"} with the ` +
            `${one ? "random vector it" : "random vectors they"} started with, only shrunk by weight decay ` +
            "(the note on tokens never read in training, on this page, says why).",
        );
      }
      if (tokens.some((t) => t.text.includes("\uFFFD"))) {
        notes.push(
          "“�” marks a token that holds only some of a character's bytes: that character is split " +
            "over several cl100k tokens (chapter 1).",
        );
      }
      const last = window.length ? window[window.length - 1] : null;
      if (last && last === tokens[tokens.length - 1] && /^ +$/.test(this.tokenizer.decode([last.cl100k]))) {
        notes.push(
          `Your prompt ends with a space, and a space at the end is a token of its own (“${last.text}”); ` +
            "inside a sentence the next word carries its space. So the table below predicts what " +
            "follows a lone space in the textbook, not the next word: remove the space at the end.",
        );
      }
      if (notes.length) this.showMessage(notes.join(" "));
      else this.unknown.hidden = true;
    }

    /** The tokens the model reads (the known ones inside its window), each in quotes. */
    readTokens() {
      return this.result.window.map((t) => `“${t.text}”`).join(" ");
    }

    /** A word at the start of the text has no space before it, so it is a different token from
     * the same word inside a sentence (chapter 1). Where the whole word, with a space before it,
     * is one token the model knows, say so: "customer" is unknown, "␣customer" is not. (A word
     * that stays unknown with its space, "Héllo", gets no hint.) */
    spaceHint() {
      const hints = [];
      for (const piece of book.splitCl100k(this.result.text)) {
        if (/^\s/.test(piece)) continue;
        const ids = this.tokenizer.encode(piece);
        if (ids.every((id) => this.model.toModelId(id) !== undefined)) continue; // nothing unknown
        const spaced = this.tokenizer.encode(" " + piece);
        if (spaced.length !== 1 || this.model.toModelId(spaced[0]) === undefined) continue;
        const hint = `“${ids.map((id) => this.tokenizer.tokenString(id)).join("")}” without a space before it is a different token from ` +
          `“${this.tokenizer.tokenString(spaced[0])}”, which the model knows`;
        if (!hints.includes(hint)) hints.push(hint);
      }
      if (!hints.length) return "";
      return ` (${hints.join("; ")}: put a space before it, or start with another word.)`;
    }

    showMessage(text) {
      this.unknown.textContent = text;
      this.unknown.hidden = false;
    }

    showAttention() {
      const r = this.result;
      this.shownWeights = null;
      if (!r || !r.attention) {
        this.attention.replaceChildren();
        this.attention.setAttribute("width", 0);
        this.attention.setAttribute("height", 0);
        this.cell.textContent = "";
        this.previous.textContent = "";
        return;
      }
      const block = Number(this.blockSelect.value);
      const head = Number(this.headSelect.value);
      const weights = r.attention[block][head];
      this.shownWeights = weights;
      this.shownLabels = r.window.map((t) => t.text);
      drawAttention(this.attention, weights, this.shownLabels, `attention weights of block ${block}, head ${head}`);
      this.cell.textContent = "Point at a cell, or tap it, to read its weight to three decimals here.";
      this.showPrevious(block, head);
    }

    /** Under the map: the weight on the previous token, for the chosen head and for every head of
     * the chosen block, against an even spread (Things to try 2). */
    showPrevious(block, head) {
      const heads = this.result.attention[block];
      const T = heads[0].length;
      if (T < 2) {
        this.previous.textContent = "";
        return;
      }
      const shares = heads.map((w) => previousTokenShare(w).share);
      const mean = shares.reduce((a, b) => a + b, 0) / shares.length;
      const { even } = previousTokenShare(heads[0]);
      const f = (v) => v.toFixed(2);
      this.previous.textContent =
        `Weight on the previous token (the cells just left of the diagonal), averaged over rows 1 to ${T - 1}: ` +
        `${f(shares[head])} in this head; ${shares.map(f).join(", ")} in the ${heads.length} heads of block ${block} ` +
        `(mean ${f(mean)}). An even spread would give ${f(even)}.`;
    }

    showNext() {
      const tau = this.temperatureNow;
      const V = this.model.config.vocab_size;
      this.temperatureValue.textContent = tau.toFixed(2);
      const r = this.result;
      if (!r || !r.logits) {
        this.next.replaceChildren();
        this.nextAbout.textContent = "";
        return;
      }
      const lastToken = r.window[r.window.length - 1].text;
      const read = r.window.length === 1 ? "that token alone" : `all ${r.window.length} tokens it read`;
      this.nextAbout.textContent =
        `The ten most likely tokens to follow “${lastToken}”, the last token the model read: ` +
        `computed at its position from ${read}, as softmax(logits / temperature). Probabilities to ` +
        `3 significant digits; each bar is drawn relative to the first one. An even spread over all ` +
        `${V.toLocaleString("en")} tokens would give each ${(1 / V).toPrecision(3)}.`;
      const last = r.logits[r.logits.length - 1];
      const probs = book.softmax(last, tau);
      const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a]).slice(0, 10);
      this.next.replaceChildren(
        el("tr", {}, el("th", {}, "next token"), el("th", {}, "probability"), el("th", {}, "")),
        ...order.map((id) => {
          const bar = el("span", { class: "gptp-bar" });
          bar.style.width = `${((probs[id] / probs[order[0]]) * 100).toFixed(1)}%`;
          return el(
            "tr",
            { "data-model": id },
            el("td", { class: "gptp-token-text" }, this.tokenizer.tokenString(this.model.toCl100kId(id))),
            el("td", { class: "gptp-probability" }, probs[id].toPrecision(3)),
            el("td", { class: "gptp-bar-cell" }, bar),
          );
        }),
      );
      if (this.timings.firstPrediction === undefined) {
        this.timings.firstPrediction = performance.now(); // since the page started loading
      }
    }

    /** Sample the continuation a few tokens at a time, writing it as it grows: between chunks
     * the browser can draw the page and take clicks. A new prompt stops it (see update). */
    async generate() {
      const r = this.result;
      if (!r || !r.logits) {
        this.output.textContent = "Give a prompt the model can read first (see above).";
        return;
      }
      const V = this.model.config.vocab_size;
      const steps = clampField(this.steps, 1, MAX_NEW_TOKENS, 30);
      const temperature = clampField(this.genTemperature, 0, 3, 0, false);
      const topK = clampField(this.topK, 0, V, 0);
      const random = book.seededRandom(clampField(this.seed, 0, 2 ** 32 - 1, 0));
      const run = {};
      this.running = run;
      this.generateButton.disabled = true;
      // the prompt as typed: the tokens that were left out struck through (the word, not the space
      // before it), the known ones before the window (which the model no longer sees) greyed out
      const read = new Set(r.window);
      const echo = r.tokens.map((t) => {
        const piece = this.tokenizer.decode([t.cl100k]);
        if (t.model === undefined) {
          const [, space, word] = piece.match(/^( *)([^]*)$/);
          return word ? el("span", {}, space, el("del", { class: "gptp-left-out" }, word)) : el("del", { class: "gptp-left-out" }, piece);
        }
        return read.has(t) ? piece : el("span", { class: "gptp-outside" }, piece);
      });
      const written = el("strong", {});
      this.output.replaceChildren(el("span", { class: "gptp-prompt-echo" }, ...echo), written);
      const prompt = r.window.map((t) => t.model);
      let ids = [];
      let seconds = 0; // time spent computing, without the pauses between chunks
      while (ids.length < steps) {
        const started = performance.now();
        const n = Math.min(TOKENS_PER_CHUNK, steps - ids.length);
        ids = ids.concat(this.model.generate(prompt.concat(ids), n, { temperature, topK, random }));
        seconds += (performance.now() - started) / 1000;
        written.textContent = this.tokenizer.decode(ids.map((id) => this.model.toCl100kId(id)));
        this.timing.textContent = `Generating… ${ids.length} of ${steps}`;
        await new Promise((resolve) => setTimeout(resolve, 0));
        if (this.running !== run) return; // the prompt changed meanwhile
      }
      this.stopGenerating();
      this.timings.tokensPerSecond = steps / seconds;
      this.timing.textContent =
        `${plural(steps, "token")} in ${seconds.toFixed(2)} s (${(steps / seconds).toFixed(0)} tokens/s), computed in your browser.`;
      this.root.dataset.generated = String(Number(this.root.dataset.generated || 0) + 1);
    }

    stopGenerating() {
      this.running = null;
      this.generateButton.disabled = false;
    }
  }

  async function start(root) {
    const base = new URL("../web-model/", here);
    root.dataset.state = "loading";
    root.textContent = "Loading the trained model…";
    try {
      await loadScript(new URL("model.js", base).href);
      const data = global.gptWebModel;
      if (!data || !data.available) {
        root.replaceChildren(el("div", { class: "gptp-message", id: "gptp-missing" }, data ? data.message : "The model is missing from this build of the book."));
        root.dataset.state = "missing";
        return;
      }
      await loadScript(new URL("tokenizer.js", base).href);
      const model = new book.GPTModel(data);
      const tokenizer = new book.BytePairTokenizer(global.gptWebTokenizer);
      const about = { corpus: corpusName(data), parameters: data.num_parameters, step: data.step };
      for (const span of document.querySelectorAll(".gptp-corpus")) span.textContent = about.corpus;
      const playground = new Playground(root, model, tokenizer, about);
      book.playground = playground;
      playground.update();
      root.dataset.state = "ready";
    } catch (err) {
      root.replaceChildren(el("div", { class: "gptp-message" }, `The model could not be started: ${err.message}`));
      root.dataset.state = "error";
      throw err;
    }
  }

  function init() {
    const root = document.getElementById("gpt-playground");
    if (root && !root.dataset.state) start(root);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})(window);
