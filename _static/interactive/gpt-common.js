/* What the book's page scripts share: building HTML and SVG elements, a stable softmax, and
 * base64 text back to bytes.
 *
 * The other scripts of this folder take these from window.GPTBook when they load, so this file
 * must load first: _ext/gptbook_web.py puts it at the head of the page's scripts.
 */
(function (global) {
  "use strict";

  const SVG = "http://www.w3.org/2000/svg";

  /** An HTML element: el("div", {class: "x"}, child, "text", ...). */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    for (const c of children) node.append(c);
    return node;
  }

  /** An SVG element with attributes and, optionally, its text. */
  function svgEl(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /** softmax(z / temperature) (chapters 6 and 11), computed stably: the largest score is
   * subtracted first, so no exponential overflows. */
  function softmax(z, temperature = 1) {
    let max = -Infinity;
    for (const v of z) max = Math.max(max, v);
    const out = new Float64Array(z.length);
    let total = 0;
    for (let i = 0; i < z.length; i++) {
      out[i] = Math.exp((z[i] - max) / temperature);
      total += out[i];
    }
    for (let i = 0; i < z.length; i++) out[i] /= total;
    return out;
  }

  /** Base64 text -> its bytes (the exported weights and tokenizer table travel as base64). */
  function decodeBase64(text) {
    const raw = atob(text);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes;
  }

  global.GPTBook = Object.assign(global.GPTBook || {}, { el, svgEl, softmax, decodeBase64 });
})(window);
