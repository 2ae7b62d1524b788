// A small Markdown renderer that builds DOM nodes and never parses HTML.
//
// Every piece of model text reaches the page as a Text node (append(string)
// or textContent); the only elements created are the fixed set below, and a
// link keeps its href only for http:, https: and mailto: URLs.  So markup in
// the text (<script>, <img onerror=...>) is shown as the characters it is.
// Supported: fenced code blocks, headings, lists, block quotes, paragraphs,
// and inline code, **bold**, *italic* and [links](https://...).
'use strict';

(function () {
  // one alternative per inline form: `code`, **bold**, *italic*, [text](url)
  const INLINE = new RegExp([
    /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source,
    /\*\*(?=\S)([\s\S]*?\S)\*\*/.source,
    /\*(?=[^\s*])([^*]*?[^\s*])\*/.source,
    /\[([^\]\n]+)\]\(([^)\s]+)\)/.source,
  ].join('|'), 'g');
  const SAFE_HREF = /^(https?:|mailto:)/i;

  function el(tag, text) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function inline(text, parent) {
    let last = 0;
    INLINE.lastIndex = 0;
    const matches = [...text.matchAll(INLINE)];
    for (const m of matches) {
      if (m.index > last) parent.append(text.slice(last, m.index));
      if (m[1] !== undefined) {
        parent.append(el('code', m[2]));
      } else if (m[3] !== undefined) {
        const b = el('strong');
        inline(m[3], b);
        parent.append(b);
      } else if (m[4] !== undefined) {
        const i = el('em');
        inline(m[4], i);
        parent.append(i);
      } else if (SAFE_HREF.test(m[6])) {
        const a = el('a', m[5]);
        a.href = m[6];
        a.rel = 'noopener noreferrer';
        a.target = '_blank';
        parent.append(a);
      } else {
        parent.append(m[0]);
      }
      last = m.index + m[0].length;
    }
    if (last < text.length) parent.append(text.slice(last));
  }

  function paragraph(lines, parent) {
    const p = el('p');
    lines.forEach((line, i) => {
      if (i) p.append(el('br'));
      inline(line, p);
    });
    parent.append(p);
  }

  const FENCE = /^\s*(```|~~~)\s*([\w+-]*)\s*$/;
  const HEADING = /^(#{1,6})\s+(.*)$/;
  const BULLET = /^\s*[-*+]\s+(.*)$/;
  const NUMBER = /^\s*\d{1,9}[.)]\s+(.*)$/;
  const QUOTE = /^\s*>\s?(.*)$/;

  function blocks(lines, parent) {
    let i = 0;
    let para = [];
    const flush = () => {
      if (para.length) paragraph(para, parent);
      para = [];
    };
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = FENCE.exec(line))) {
        flush();
        const body = [];
        i += 1;
        while (i < lines.length && !(FENCE.exec(lines[i]) && lines[i].trim().startsWith(m[1]))) {
          body.push(lines[i]);
          i += 1;
        }
        const pre = el('pre');
        const code = el('code', body.join('\n'));
        if (m[2]) code.dataset.lang = m[2];
        pre.append(code);
        parent.append(pre);
        i += 1;
      } else if ((m = HEADING.exec(line))) {
        flush();
        const h = el('h' + m[1].length);
        inline(m[2], h);
        parent.append(h);
        i += 1;
      } else if (BULLET.test(line) || NUMBER.test(line)) {
        flush();
        const ordered = !BULLET.test(line);
        const re = ordered ? NUMBER : BULLET;
        const list = el(ordered ? 'ol' : 'ul');
        while (i < lines.length && (m = re.exec(lines[i]))) {
          const li = el('li');
          inline(m[1], li);
          list.append(li);
          i += 1;
        }
        parent.append(list);
      } else if (QUOTE.test(line)) {
        flush();
        const quoted = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
          quoted.push(m[1]);
          i += 1;
        }
        const bq = el('blockquote');
        blocks(quoted, bq);
        parent.append(bq);
      } else if (!line.trim()) {
        flush();
        i += 1;
      } else {
        para.push(line);
        i += 1;
      }
    }
    flush();
  }

  function render(text) {
    const frag = document.createDocumentFragment();
    blocks(String(text).replace(/\r\n?/g, '\n').split('\n'), frag);
    return frag;
  }

  window.MlxMarkdown = Object.freeze({ render });
})();
