// Terminal output as styled text: ANSI SGR codes (colours, bold, italic,
// underline) become classes on text spans built from the parsed codes;
// every other escape or control sequence is dropped. Nothing is ever parsed
// as markup.

import { el } from './dom.js';

const COLOURS = ['black', 'red', 'green', 'yellow', 'blue', 'magenta', 'cyan', 'white'];
// CSI ... final byte, OSC ... (BEL | ESC \), other two-byte escapes.
// eslint-disable-next-line no-control-regex
const ESCAPE = /\x1b\[([0-9;?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]/g;
// eslint-disable-next-line no-control-regex
const CONTROL = /[\x00-\x08\x0b-\x1f\x7f]/g;

/** The style state of a stream, carried across its chunks. */
export class AnsiState {
  constructor() {
    this.reset();
  }

  reset() {
    this.fg = null;
    this.bg = null;
    this.bold = false;
    this.italic = false;
    this.underline = false;
  }

  apply(params) {
    const codes = params === '' ? [0] : params.split(';').map((p) => Number(p) || 0);
    for (let i = 0; i < codes.length; i += 1) {
      const code = codes[i];
      if (code === 0) this.reset();
      else if (code === 1) this.bold = true;
      else if (code === 3) this.italic = true;
      else if (code === 4) this.underline = true;
      else if (code === 22) this.bold = false;
      else if (code === 23) this.italic = false;
      else if (code === 24) this.underline = false;
      else if (code >= 30 && code <= 37) this.fg = COLOURS[code - 30];
      else if (code >= 90 && code <= 97) this.fg = `bright-${COLOURS[code - 90]}`;
      else if (code === 39) this.fg = null;
      else if (code >= 40 && code <= 47) this.bg = COLOURS[code - 40];
      else if (code >= 100 && code <= 107) this.bg = `bright-${COLOURS[code - 100]}`;
      else if (code === 49) this.bg = null;
      else if (code === 38 || code === 48) {
        // 256-colour and true-colour forms: skipped, not shown as text.
        i += codes[i + 1] === 5 ? 2 : 4;
      }
    }
  }

  classes() {
    const out = [];
    if (this.fg) out.push(`fg-${this.fg}`);
    if (this.bg) out.push(`bg-${this.bg}`);
    if (this.bold) out.push('bold');
    if (this.italic) out.push('italic');
    if (this.underline) out.push('underline');
    return out.join(' ');
  }
}

/** Spans for `text`, styled by the SGR codes in it (and `state` before it). */
export function render(text, state) {
  const spans = [];
  let at = 0;
  const push = (part) => {
    const clean = part.replace(CONTROL, '');
    if (!clean) return;
    const classes = state.classes();
    spans.push(classes ? el('span', { class: classes, text: clean }) : document.createTextNode(clean));
  };
  ESCAPE.lastIndex = 0;
  for (let match = ESCAPE.exec(text); match; match = ESCAPE.exec(text)) {
    push(text.slice(at, match.index));
    if (match[2] === 'm') state.apply(match[1]);
    at = ESCAPE.lastIndex;
  }
  push(text.slice(at));
  return spans;
}
