/* "Try the model": the model trained in chapter 10b, running in the page.
 *
 * The page holds an empty <div id="gpt-playground">. This script loads the exported model
 * (../web-model/model.js and tokenizer.js, next to this file's folder, written when the book is
 * built) with <script> tags, which also work when the book is opened from a folder on disk, and
 * then builds the panels: tokens, attention weights, next-token probabilities and generation.
 * Everything is computed in the browser by gpt-tokenizer.js and gpt-model.js.
 *
 * A prompt may hold tokens the model never saw (its vocabulary is only its corpus's tokens). They
 * are named, struck through and left out; the model runs on the tokens it knows.
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

  /** White -> dark blue for attention weights in [0, 1]. */
  function weightColour(w) {
    const t = Math.max(0, Math.min(1, w));
    const mix = (a, b) => Math.round(a + (b - a) * t);
    return `rgb(${mix(255, 8)}, ${mix(255, 48)}, ${mix(255, 107)})`;
  }

  function shortLabel(s, n = 12) {
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  /** The attention weights of one head as a T x T heatmap with token labels. The SVG keeps its
   * natural size (labels 12 px, cell numbers 9 px): on a narrow screen its box scrolls sideways.
   * Text takes the page's colour (currentColor), so the labels read in light and dark mode. */
  function drawAttention(svg, weights, labels) {
    svg.replaceChildren();
    const T = labels.length;
    const cell = Math.max(18, Math.min(34, Math.floor(480 / T)));
    const margin = 110;
    const shown = labels.map((label) => shortLabel(label));
    // a column label is turned by -60°: it reaches cos 60° = 0.5 of its length to the right of its
    // anchor (about 7.5 px a character at 12 px), past the last column's centre
    const longest = Math.max(...shown.map((label) => label.length));
    const width = margin + T * cell - cell / 2 + Math.ceil(0.5 * 7.5 * longest) + 12;
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
          fill: j > i ? "#eeeeee" : weightColour(w),
        });
        if (j > i) rect.setAttribute("class", "gptp-masked"); // its colour follows the theme (CSS)
        const title = svgEl("title");
        title.textContent = j > i ? "masked (a future token)" : `${labels[i]} → ${labels[j]}: ${w.toFixed(3)}`;
        rect.append(title);
        svg.append(rect);
        if (j <= i && cell >= 26) {
          const text = svgEl("text", {
            x: margin + j * cell + cell / 2,
            y: margin + i * cell + cell / 2 + 4,
            "text-anchor": "middle",
            "font-size": 9,
            fill: w > 0.55 ? "white" : "#222",
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
    axis.textContent = "rows: query token · columns: key token";
    svg.append(axis);
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
      this.temperature = el("input", { id: "gptp-temperature", type: "range", min: -1, max: 1, step: 0.05, value: 0 });
      this.temperatureValue = el("output", { id: "gptp-temperature-value" });
      this.nextAbout = el("p", { id: "gptp-next-about", class: "gptp-note" });
      this.next = el("table", { id: "gptp-next", class: "gptp-next" });
      this.steps = el("input", { id: "gptp-steps", type: "number", min: 1, max: 200, value: 30 });
      this.genTemperature = el("input", { id: "gptp-gen-temperature", type: "number", min: 0, max: 3, step: 0.1, value: 0.8 });
      this.topK = el("input", { id: "gptp-topk", type: "number", min: 0, max: V, value: 10, title: `0: no cut, all ${V.toLocaleString("en")} tokens can be drawn` });
      this.seed = el("input", { id: "gptp-seed", type: "number", min: 0, value: 1 });
      this.generateButton = el("button", { id: "gptp-generate", type: "button" }, "Generate");
      this.output = el("div", { id: "gptp-output", class: "gptp-output" });
      this.timing = el("div", { id: "gptp-timing", class: "gptp-note" });

      const section = (title, ...children) => el("section", { class: "gptp-panel" }, el("h3", {}, title), ...children);
      this.root.replaceChildren(
        section(
          "1. Your prompt and its tokens",
          el("p", { id: "gptp-about", class: "gptp-note" },
            `A model of ${parameters.toLocaleString("en")} parameters, trained${trained} on ${corpus}.`),
          el("div", { id: "gptp-examples", class: "gptp-examples" }, "Try an example: ", ...examples),
          el("label", { for: "gptp-prompt" }, `Or type some text (the model reads the last ${T} tokens it knows):`),
          this.prompt,
          this.tokens,
          this.unknown,
        ),
        section(
          "2. Attention weights",
          el("div", { class: "gptp-controls" },
            el("label", {}, "block ", this.blockSelect),
            el("label", {}, "head ", this.headSelect)),
          el("div", { class: "gptp-scroll" }, this.attention),
        ),
        section(
          "3. The next token",
          el("div", { class: "gptp-controls" },
            el("label", { for: "gptp-temperature" }, "temperature (this table only) "), this.temperature, this.temperatureValue),
          this.nextAbout,
          this.next,
        ),
        section(
          "4. Generate a continuation",
          el("div", { class: "gptp-controls" },
            el("label", {}, "new tokens ", this.steps),
            el("label", {}, "sampling temperature (0: greedy) ", this.genTemperature),
            el("label", {}, "top-k (0: no cut) ", this.topK),
            el("label", {}, "seed ", this.seed),
            this.generateButton),
          this.output,
          this.timing,
        ),
      );
      this.prompt.addEventListener("input", () => this.update());
      this.blockSelect.addEventListener("change", () => this.showAttention());
      this.headSelect.addEventListener("change", () => this.showAttention());
      this.temperature.addEventListener("input", () => this.showNext());
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
      this.output.replaceChildren(); // a continuation of the previous prompt would mislead
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
          if (isUnknown) kind = " gptp-unknown";
          else if (!read.has(t)) kind = " gptp-outside"; // known, but before the window
          return el(
            "span",
            {
              class: "gptp-token" + kind,
              "data-cl100k": t.cl100k,
              "data-model": isUnknown ? "" : t.model,
              title: isUnknown ? "not in the model's vocabulary: left out" : `cl100k id ${t.cl100k}, model id ${t.model}`,
            },
            el(isUnknown ? "del" : "span", { class: "gptp-token-text" }, t.text),
            el("span", { class: "gptp-token-id" }, isUnknown ? `${t.cl100k} · left out` : `${t.cl100k} · ${t.model}`),
          );
        }),
      );
      if (!tokens.length) {
        this.showMessage("Type at least one word, or click an example, to see what the model makes of it.");
      } else if (unknown.length) {
        const names = [...new Set(unknown.map((t) => `“${t.text}” (cl100k id ${t.cl100k})`))];
        const one = names.length === 1;
        const what =
          `The model has never seen ${one ? "this token" : "these tokens"}: ${names.join(", ")}. ` +
          `Its vocabulary holds only the tokens of ${this.about.corpus}, so it has no vector for ` +
          `${one ? "it" : "them"} (chapter 9). `;
        const T = this.model.config.context_length;
        const others = `${known.length} other token${known.length === 1 ? "" : "s"}`;
        const leftOut = known.length
          ? `${one ? "It is" : "They are"} struck through above and left out: the model reads ` +
            (known.length > T ? `the last ${T} of the ${others}: ` : `the ${others}: `) +
            `${this.readTokens()}.`
          : "No token of this prompt is left to read: rephrase it, or click an example.";
        this.showMessage(what + leftOut + this.spaceHint(unknown));
      } else {
        this.unknown.hidden = true;
      }
    }

    /** The tokens the model reads (the known ones inside its window), each in quotes. */
    readTokens() {
      return this.result.window.map((t) => `“${t.text}”`).join(" ");
    }

    /** A word at the start of the text has no space before it, so it is another token than the
     * same word inside a sentence (chapter 1). Where that other token is one the model knows, say
     * so: "customer" is unknown, "␣customer" is not. */
    spaceHint(unknown) {
      const hints = [];
      for (const t of unknown) {
        const piece = this.tokenizer.decode([t.cl100k]);
        if (/^\s/.test(piece)) continue;
        const spaced = this.tokenizer.encode(" " + piece);
        if (spaced.length !== 1 || this.model.toModelId(spaced[0]) === undefined) continue;
        const hint = `“${t.text}” without a space before it is another token than ` +
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
      if (!r || !r.attention) {
        this.attention.replaceChildren();
        this.attention.setAttribute("width", 0);
        this.attention.setAttribute("height", 0);
        return;
      }
      const weights = r.attention[Number(this.blockSelect.value)][Number(this.headSelect.value)];
      drawAttention(this.attention, weights, r.window.map((t) => t.text));
    }

    showNext() {
      const tau = this.temperatureNow;
      this.temperatureValue.textContent = tau.toFixed(2);
      const r = this.result;
      if (!r || !r.logits) {
        this.next.replaceChildren();
        this.nextAbout.textContent = "";
        return;
      }
      const lastToken = r.window[r.window.length - 1].text;
      this.nextAbout.textContent =
        `The ten most likely tokens to follow “${lastToken}”, the last token the model read, ` +
        `as softmax(logits / temperature).`;
      const last = r.logits[r.logits.length - 1];
      const probs = book.softmax(last, tau);
      const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a]).slice(0, 10);
      this.next.replaceChildren(
        el("tr", {}, el("th", {}, "next token"), el("th", {}, "probability"), el("th", {}, "")),
        ...order.map((id) => {
          const bar = el("span", { class: "gptp-bar" });
          bar.style.width = `${(probs[id] * 100).toFixed(1)}%`;
          return el(
            "tr",
            { "data-model": id },
            el("td", { class: "gptp-token-text" }, this.tokenizer.tokenString(this.model.toCl100kId(id))),
            el("td", {}, probs[id].toFixed(3)),
            el("td", { class: "gptp-bar-cell" }, bar),
          );
        }),
      );
      if (this.timings.firstPrediction === undefined) {
        this.timings.firstPrediction = performance.now(); // since the page started loading
      }
    }

    generate() {
      const r = this.result;
      if (!r || !r.logits) {
        this.output.textContent = "Give a prompt the model can read first (see above).";
        return;
      }
      const steps = Math.max(1, Math.min(200, Number(this.steps.value) || 1));
      const temperature = Math.max(0, Number(this.genTemperature.value) || 0);
      const topK = Math.max(0, Math.floor(Number(this.topK.value) || 0));
      const random = book.seededRandom(Number(this.seed.value) || 0);
      const started = performance.now();
      const ids = this.model.generate(r.window.map((t) => t.model), steps, { temperature, topK, random });
      const seconds = (performance.now() - started) / 1000;
      const text = this.tokenizer.decode(ids.map((id) => this.model.toCl100kId(id)));
      // the prompt as typed: the tokens that were left out struck through, the known ones before
      // the window (which the model no longer sees) greyed out
      const read = new Set(r.window);
      const echo = r.tokens.map((t) => {
        const piece = this.tokenizer.decode([t.cl100k]);
        if (t.model === undefined) return el("del", { class: "gptp-left-out" }, piece);
        return read.has(t) ? piece : el("span", { class: "gptp-outside" }, piece);
      });
      this.output.replaceChildren(el("span", { class: "gptp-prompt-echo" }, ...echo), el("strong", {}, text));
      this.timings.tokensPerSecond = steps / seconds;
      this.timing.textContent = `${steps} tokens in ${seconds.toFixed(2)} s (${(steps / seconds).toFixed(0)} tokens/s), computed in your browser.`;
      this.root.dataset.generated = String(Number(this.root.dataset.generated || 0) + 1);
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
