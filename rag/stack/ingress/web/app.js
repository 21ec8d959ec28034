// The page of the `rag` model: the conversation lives here and is sent whole each turn.
// It talks to /v1/chat/completions like any OpenAI client, streaming, and draws each
// sentence with the sources that support it from the response's `rag` extension field.
// The browser sends the API key itself (HTTP Basic, asked for once when the page opened).
"use strict";

const conversation = []; // {role, content}: what the server gets each turn
const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text; // never innerHTML: answers are not markup
  return node;
}

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

class AssistantMessage {
  constructor() {
    this.node = el("div", "message assistant");
    this.answer = el("div", "answer");
    this.extra = el("div");
    this.cards = el("div", "sources");
    this.node.append(this.answer, this.extra, this.cards);
    $("conversation").append(this.node);
    this.content = "";
    this.sentences = [];
    this.sources = new Map();
    this.early = null; // the first words shown before their sentence ends
  }

  addSources(sources) {
    for (const s of sources) this.sources.set(s.n, s);
    this.drawCards();
  }

  showEarly(words) {
    // The first sentence's first words, guarded, before the sentence ends: replaced by it.
    this.early = el("span", "sentence early", words);
    this.answer.append(this.early);
  }

  addSentences(sentences) {
    if (this.early) {
      this.early.remove();
      this.early = null;
    }
    for (const s of sentences) {
      this.sentences.push(s);
      const span = el("span", "sentence" + (s.support === "unsupported" || s.support === "restates" ? " unsupported" : ""), s.text);
      span.dataset.sources = s.sources.join(",");
      this.answer.append(span);
      for (const n of s.sources) {
        const cite = el("button", "cite", `[${n}]`);
        cite.type = "button";
        cite.title = this.sources.has(n) ? this.where(this.sources.get(n)) : `source ${n}`;
        cite.addEventListener("click", () => this.highlight(n));
        this.answer.append(cite);
      }
      if (!s.sources.length && (s.support === "unsupported" || s.support === "restates")) {
        const mark = el("span", "cite missing", "[no source]");
        mark.title = "no shown source supports this sentence";
        this.answer.append(mark);
      }
      this.answer.append(document.createTextNode(s.sep || " ")); // a list item or code block keeps its line
    }
    this.drawCards();
  }

  where(s) {
    return s.path + (s.heading ? ` — ${s.heading}` : "");
  }

  highlight(n) {
    for (const card of this.cards.children) card.classList.toggle("highlight", card.dataset.n === String(n));
    const card = this.cards.querySelector(`[data-n="${n}"]`);
    if (card) card.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }

  drawCards() {
    this.cards.replaceChildren();
    for (const s of this.sources.values()) {
      const supports = this.sentences.map((x, i) => (x.sources.includes(s.n) ? i + 1 : 0)).filter(Boolean);
      const card = el("div", "source-card" + (supports.length ? " cited" : ""));
      card.dataset.n = String(s.n);
      card.append(el("div", "where", `[${s.n}] ${s.path}`));
      if (s.heading) card.append(el("div", "heading", s.heading));
      card.append(el("div", "supports", supports.length ? `supports sentence ${supports.join(", ")}` : "shown to the model, cited by no sentence"));
      const details = el("details");
      details.append(el("summary", "", "passage"), el("pre", "", s.snippet));
      card.append(details);
      this.cards.append(card);
    }
  }

  finish(rag, content) {
    this.content = content;
    if (rag.blocked) {
      this.answer.replaceChildren(el("span", "refusal", rag.refusal || `refused by the guard (${rag.blocked} stage)`));
      this.cards.replaceChildren();
      return;
    }
    if (!this.sentences.length) this.answer.replaceChildren(el("span", "not-covered", content.trim()));
    if (rag.fallback) {
      this.extra.append(el("div", "fallback", `Most of this answer has no support in the sources. What the documents say, [${rag.fallback.n}] ${this.where(rag.fallback)}:\n${rag.fallback.passage}`));
    }
    this.addSources(rag.sources || []);
  }
}

async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        yield JSON.parse(line.slice(6));
      }
    }
  }
}

async function ask(question) {
  const userNode = el("div", "message user", question);
  $("conversation").append(userNode);
  conversation.push({ role: "user", content: question });
  const message = new AssistantMessage();
  const started = performance.now();
  let content = "";
  let firstWord = null;
  status("retrieving and checking…");
  try {
    const response = await fetch(new URL("/v1/chat/completions", location.origin), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      credentials: "same-origin",
      body: JSON.stringify({ model: "rag", stream: true, messages: conversation }),
    });
    if (!response.ok) {
      let why = `${response.status} ${response.statusText}`;
      try { why = (await response.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(why);
    }
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      const rag = chunk.rag || {};
      const choice = (chunk.choices || [])[0] || {};
      content += (choice.delta && choice.delta.content) || "";
      if (rag.sources && !choice.finish_reason) message.addSources(rag.sources);
      const early = rag.early && !choice.finish_reason;
      if (early || (rag.sentences && !choice.finish_reason && rag.sentences.length)) {
        if (firstWord === null) {
          firstWord = performance.now() - started;
          message.node.dataset.firstWordMs = String(Math.round(firstWord));
          status(`answering (first words after ${(firstWord / 1000).toFixed(1)} s)…`);
        }
        if (early) message.showEarly(choice.delta.content);
        else message.addSentences(rag.sentences);
      }
      if (choice.finish_reason) {
        message.finish(rag, content);
        message.node.dataset.finish = choice.finish_reason;
      }
    }
    conversation.push({ role: "assistant", content });
    const total = (performance.now() - started) / 1000;
    message.node.dataset.totalMs = String(Math.round(total * 1000));
    status(`answered in ${total.toFixed(1)} s` + (firstWord !== null ? ` (first words after ${(firstWord / 1000).toFixed(1)} s)` : ""));
  } catch (error) {
    conversation.pop(); // the question was not answered: do not send it as history
    message.node.remove();
    userNode.classList.add("failed");
    status(`could not answer: ${error.message}`, true);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const form = $("ask-form");
  const input = $("question");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const question = input.value.trim();
    if (!question) return;
    input.value = "";
    $("ask").disabled = true;
    try { await ask(question); } finally { $("ask").disabled = false; input.focus(); }
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  $("new").addEventListener("click", () => {
    conversation.length = 0;
    $("conversation").replaceChildren();
    status("");
    input.focus();
  });
  input.focus();
});
