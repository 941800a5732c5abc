/* signature.c -- the C types of a kernel's parameters, from its mangled
 * name or from a declared C parameter list.
 *
 * The demangler reads the part of the Itanium C++ ABI's grammar that a
 * kernel's name uses: a plain, nested or template function name, then its
 * parameters' types (builtins, pointers, cv-qualifiers, class and enum
 * names with their template arguments, substitutions S_ / S<n>_ / St,
 * template parameters T_, function and array types).  Anything else
 * (local names, lambdas, expressions, packs, references) is not
 * understood, and the caller falls back to sizes.  It will read hostile
 * names: nesting is bounded by CS_SIG_DEPTH, the spellings of all the
 * types met by CS_SIG_TEXT_MAX bytes, and every reference is checked
 * before it is followed. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "signature.h"

/* Spellings live in one arena: a span is where. */
struct span {
  uint32_t off, len;
};

/* A type met while reading. */
struct ty {
  uint8_t cls, size;
  bool is_void;
  struct span sp;
};

/* The substitution candidates and template arguments remembered. */
#define SUBS_MAX 256
#define TARGS_MAX 32

struct work {
  char text[CS_SIG_TEXT_MAX]; /* the arena */
  size_t len;
  struct span name;
  struct ty params[CS_SIG_PARAMS_MAX];
  size_t nparams;
  /* the demangler's */
  const char *s, *end;
  struct ty subs[SUBS_MAX];
  size_t nsubs;
  struct ty targs[TARGS_MAX];
  size_t ntargs;
  int depth;
};

static struct work *work_new(void) {
  struct work *w = malloc(sizeof *w);
  if (w) {
    w->len = w->nparams = w->nsubs = w->ntargs = 0;
    w->depth = 0;
    w->name = (struct span){0, 0};
  }
  return w;
}

/* ---- the arena ----------------------------------------------------------- */

static bool put(struct work *w, const char *s, size_t n) {
  if (n > CS_SIG_TEXT_MAX - w->len)
    return false;
  memmove(w->text + w->len, s, n); /* s may be in the arena */
  w->len += n;
  return true;
}

static bool puts_(struct work *w, const char *s) {
  return put(w, s, strlen(s));
}

static bool put_span(struct work *w, struct span sp) {
  return put(w, w->text + sp.off, sp.len);
}

static struct span since(const struct work *w, size_t start) {
  return (struct span){(uint32_t)start, (uint32_t)(w->len - start)};
}

/* The result: "name(type, type)" and each parameter's place in it. */
static struct cs_signature *finish(const struct work *w) {
  size_t text = w->name.len + 3;
  for (size_t i = 0; i < w->nparams; i++)
    text += w->params[i].sp.len + 2;
  struct cs_signature *sig =
      malloc(sizeof *sig + w->nparams * sizeof sig->params[0] + text);
  if (!sig)
    return NULL;
  char *t = (char *)&sig->params[w->nparams];
  size_t at = 0;
  sig->prev = NULL;
  sig->text = t;
  sig->nparams = (uint32_t)w->nparams;
  sig->name_len = w->name.len;
  memcpy(t, w->text + w->name.off, w->name.len);
  at = w->name.len;
  t[at++] = '(';
  for (size_t i = 0; i < w->nparams; i++) {
    const struct ty *p = &w->params[i];
    if (i) {
      t[at++] = ',';
      t[at++] = ' ';
    }
    sig->params[i] = (struct cs_param_type){p->cls, p->size,
                                            (uint16_t)p->sp.len, (uint32_t)at};
    memcpy(t + at, w->text + p->sp.off, p->sp.len);
    at += p->sp.len;
  }
  t[at++] = ')';
  t[at] = '\0';
  return sig;
}

/* ---- the demangler ------------------------------------------------------- */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_ident(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         c == '_' || c == '$';
}

static bool peek(const struct work *w, char c) {
  return w->s < w->end && *w->s == c;
}

static bool eat(struct work *w, char c) {
  if (!peek(w, c))
    return false;
  w->s++;
  return true;
}

static bool add_sub(struct work *w, struct ty t) {
  if (w->nsubs == SUBS_MAX)
    return false;
  w->subs[w->nsubs++] = t;
  return true;
}

static struct ty other(struct span sp) {
  return (struct ty){CS_TYPE_OTHER, 0, false, sp};
}

/* <number>, bounded far below any overflow. */
static bool number(struct work *w, size_t *out) {
  size_t v = 0;
  const char *start = w->s;
  while (w->s < w->end && is_digit(*w->s)) {
    if (v > CS_SIG_TEXT_MAX)
      return false;
    v = v * 10 + (size_t)(*w->s++ - '0');
  }
  *out = v;
  return w->s > start;
}

/* <source-name>: <length> <identifier>, copied to the arena. */
static bool source_name(struct work *w, struct span *out) {
  size_t n;
  if (!number(w, &n) || n == 0 || n > (size_t)(w->end - w->s))
    return false;
  for (size_t i = 0; i < n; i++)
    if (!is_ident(w->s[i]))
      return false;
  size_t start = w->len;
  if (!put(w, w->s, n))
    return false;
  w->s += n;
  *out = since(w, start);
  return true;
}

static bool type(struct work *w, struct ty *out);

/* After 'I': template arguments up to 'E', spelt after `base` as
 * "base<a, b>".  With `keep`, they are the function's own (T_, T0_). */
static bool template_args(struct work *w, struct span base, struct span *out,
                          bool keep) {
  struct span args[TARGS_MAX];
  size_t n = 0;
  if (keep)
    w->ntargs = 0;
  while (!eat(w, 'E')) {
    if (n == TARGS_MAX || w->s >= w->end)
      return false;
    struct ty t;
    if (eat(w, 'L')) { /* a literal: L <type> [n] <value> E */
      if (peek(w, '_') || !type(w, &t))
        return false;
      size_t start = w->len;
      if (eat(w, 'n') && !puts_(w, "-"))
        return false;
      const char *v = w->s;
      while (w->s < w->end &&
             (is_digit(*w->s) || (*w->s >= 'a' && *w->s <= 'f')))
        w->s++; /* decimal, or the hexadecimal of a float */
      if (!eat(w, 'E') || w->s - 1 == v)
        return false;
      bool ok = t.cls == CS_TYPE_BOOL && w->s - v == 2
                    ? puts_(w, *v == '0' ? "false" : "true")
                    : put(w, v, (size_t)(w->s - 1 - v));
      if (!ok)
        return false;
      t = other(since(w, start));
    } else if (!type(w, &t)) {
      return false;
    }
    args[n++] = t.sp;
    if (keep)
      w->targs[w->ntargs++] = t;
  }
  if (n == 0)
    return false;
  size_t start = w->len;
  if (!put_span(w, base) || !puts_(w, "<"))
    return false;
  for (size_t i = 0; i < n; i++)
    if ((i && !puts_(w, ", ")) || !put_span(w, args[i]))
      return false;
  if (!puts_(w, ">"))
    return false;
  *out = since(w, start);
  return true;
}

/* After 'S': a substitution (S_, S<seq>_), std:: (St) or one of the
 * abbreviations of the standard library. */
static bool substitution(struct work *w, struct ty *out) {
  static const struct {
    char c;
    const char *name;
  } abbrev[] = {{'a', "std::allocator"}, {'b', "std::basic_string"},
                {'s', "std::string"},    {'i', "std::istream"},
                {'o', "std::ostream"},   {'d', "std::iostream"}};
  if (eat(w, 't')) {
    struct span nm;
    size_t start = w->len;
    if (!puts_(w, "std::") || !source_name(w, &nm))
      return false;
    *out = other(since(w, start));
    return add_sub(w, *out);
  }
  for (size_t i = 0; i < sizeof abbrev / sizeof abbrev[0]; i++)
    if (eat(w, abbrev[i].c)) {
      size_t start = w->len;
      if (!puts_(w, abbrev[i].name))
        return false;
      *out = other(since(w, start));
      return true;
    }
  size_t idx = 0;
  if (!eat(w, '_')) {
    size_t seq = 0;
    for (;;) {
      if (w->s >= w->end)
        return false;
      char c = *w->s++;
      if (c == '_')
        break;
      size_t d;
      if (is_digit(c))
        d = (size_t)(c - '0');
      else if (c >= 'A' && c <= 'Z')
        d = (size_t)(c - 'A') + 10;
      else
        return false;
      if (seq > SUBS_MAX)
        return false;
      seq = seq * 36 + d;
    }
    idx = seq + 1;
  }
  if (idx >= w->nsubs)
    return false;
  *out = w->subs[idx];
  return true;
}

/* After 'N': a nested name up to 'E'.  Every prefix is a substitution
 * candidate, and so is the whole name of a type, but not the function's
 * own (`function`).  *tmpl: its last component is template arguments. */
static bool nested(struct work *w, struct span *out, bool function,
                   bool *tmpl) {
  struct span prefix = {0, 0};
  bool have = false, pending = false;
  *tmpl = false;
  if (peek(w, 'K') || peek(w, 'V') || peek(w, 'r') || peek(w, 'R') ||
      peek(w, 'O'))
    return false; /* a member function: never a kernel */
  for (;;) {
    if (w->s >= w->end)
      return false;
    if (eat(w, 'E'))
      break;
    if (pending && !add_sub(w, other(prefix)))
      return false;
    pending = true;
    if (eat(w, 'I')) {
      if (!have || !template_args(w, prefix, &prefix, function))
        return false;
      *tmpl = true;
      continue;
    }
    *tmpl = false;
    if (eat(w, 'S')) {
      struct ty t;
      if (have || !substitution(w, &t))
        return false;
      prefix = t.sp;
      pending = false; /* a substitution is no new candidate */
      have = true;
      continue;
    }
    eat(w, 'L'); /* internal linkage */
    struct span nm;
    if (!is_digit(w->s < w->end ? *w->s : 0) || !source_name(w, &nm))
      return false;
    if (have) {
      size_t start = w->len;
      if (!put_span(w, prefix) || !puts_(w, "::") || !put_span(w, nm))
        return false;
      prefix = since(w, start);
    } else {
      prefix = nm;
    }
    have = true;
  }
  if (!have)
    return false;
  if (!function && pending && !add_sub(w, other(prefix)))
    return false;
  *out = prefix;
  return true;
}

/* The builtin types of one letter. */
static bool builtin(struct work *w, char c, struct ty *out) {
  static const struct {
    char c;
    uint8_t cls, size;
    const char *name;
  } types[] = {
      {'v', CS_TYPE_OTHER, 0, "void"},
      {'w', CS_TYPE_INT, 4, "wchar_t"},
      {'b', CS_TYPE_BOOL, 1, "bool"},
      {'c', CS_TYPE_INT, 1, "char"},
      {'a', CS_TYPE_INT, 1, "signed char"},
      {'h', CS_TYPE_INT, 1, "unsigned char"},
      {'s', CS_TYPE_INT, 2, "short"},
      {'t', CS_TYPE_INT, 2, "unsigned short"},
      {'i', CS_TYPE_INT, 4, "int"},
      {'j', CS_TYPE_INT, 4, "unsigned int"},
      {'l', CS_TYPE_INT, 8, "long"},
      {'m', CS_TYPE_INT, 8, "unsigned long"},
      {'x', CS_TYPE_INT, 8, "long long"},
      {'y', CS_TYPE_INT, 8, "unsigned long long"},
      {'n', CS_TYPE_OTHER, 0, "__int128"},
      {'o', CS_TYPE_OTHER, 0, "unsigned __int128"},
      {'f', CS_TYPE_FLOAT, 4, "float"},
      {'d', CS_TYPE_DOUBLE, 8, "double"},
      {'e', CS_TYPE_OTHER, 0, "long double"},
      {'g', CS_TYPE_OTHER, 0, "__float128"},
  };
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (types[i].c == c) {
      size_t start = w->len;
      if (!puts_(w, types[i].name))
        return false;
      *out =
          (struct ty){types[i].cls, types[i].size, c == 'v', since(w, start)};
      return true;
    }
  return false;
}

/* After 'D': the builtin types of two letters or more. */
static bool builtin_d(struct work *w, struct ty *out) {
  size_t start = w->len;
  uint8_t cls = CS_TYPE_OTHER, size = 0;
  const char *name = NULL;
  char buf[24];
  if (w->s >= w->end)
    return false;
  switch (*w->s++) {
  case 'h': name = "half"; break;
  case 's': cls = CS_TYPE_INT, size = 2, name = "char16_t"; break;
  case 'i': cls = CS_TYPE_INT, size = 4, name = "char32_t"; break;
  case 'u': cls = CS_TYPE_INT, size = 1, name = "char8_t"; break;
  case 'n': name = "decltype(nullptr)"; break;
  case 'F': { /* DF<bits>_ (_FloatN), DF16b (std::bfloat16_t) */
    size_t bits;
    if (!number(w, &bits) || bits > 1024)
      return false;
    if (eat(w, 'b') && bits == 16)
      name = "__bf16";
    else if (eat(w, '_') || eat(w, 'x')) {
      snprintf(buf, sizeof buf, "_Float%zu", bits);
      name = buf;
    } else
      return false;
    break;
  }
  default: return false;
  }
  if (!puts_(w, name))
    return false;
  *out = (struct ty){cls, size, false, since(w, start)};
  return true;
}

/* Applies cv-qualifiers to `in`: "const float", "float* const". */
static bool qualified(struct work *w, struct ty in, bool c, bool v,
                      struct ty *out) {
  size_t start = w->len;
  const char *q = c && v ? "const volatile" : c ? "const" : v ? "volatile" : "";
  bool ok = !*q ? put_span(w, in.sp)
            : in.cls == CS_TYPE_POINTER
                ? put_span(w, in.sp) && puts_(w, " ") && puts_(w, q)
                : puts_(w, q) && puts_(w, " ") && put_span(w, in.sp);
  if (!ok)
    return false;
  *out = (struct ty){in.cls, in.size, false, since(w, start)};
  return add_sub(w, *out);
}

static bool type_at(struct work *w, struct ty *out) {
  if (w->s >= w->end)
    return false;
  char c = *w->s;
  if (c == 'r' || c == 'V' || c == 'K') {
    bool cq = false, vq = false;
    for (;;) {
      if (eat(w, 'r'))
        continue;
      if (eat(w, 'V')) {
        vq = true;
        continue;
      }
      if (eat(w, 'K')) {
        cq = true;
        continue;
      }
      break;
    }
    struct ty in;
    return type(w, &in) && qualified(w, in, cq, vq, out);
  }
  if (c == 'P') {
    w->s++;
    struct ty in;
    size_t start;
    if (!type(w, &in))
      return false;
    start = w->len;
    if (!put_span(w, in.sp) || !puts_(w, "*"))
      return false;
    *out = (struct ty){CS_TYPE_POINTER, 8, false, since(w, start)};
    return add_sub(w, *out);
  }
  if (builtin(w, c, out)) {
    w->s++;
    return true;
  }
  struct span sp;
  bool tmpl;
  switch (c) {
  case 'D': w->s++; return builtin_d(w, out);
  case 'u': /* a vendor's type */
    w->s++;
    if (!source_name(w, &sp))
      return false;
    *out = other(sp);
    return add_sub(w, *out);
  case 'N':
    w->s++;
    if (!nested(w, &sp, false, &tmpl))
      return false;
    *out = other(sp);
    return true;
  case 'S':
  case 'T': {
    w->s++;
    struct ty t;
    if (c == 'S') {
      if (!substitution(w, &t))
        return false;
    } else {
      size_t idx = 0;
      if (!eat(w, '_')) {
        if (!number(w, &idx) || !eat(w, '_'))
          return false;
        idx++;
      }
      if (idx >= w->ntargs || !add_sub(w, w->targs[idx]))
        return false;
      if (peek(w, 'I'))
        return false; /* a template template parameter */
      t = w->targs[idx];
    }
    if (eat(w, 'I')) { /* a substituted template's arguments */
      if (!template_args(w, t.sp, &sp, false))
        return false;
      t = other(sp);
      if (!add_sub(w, t))
        return false;
    }
    *out = t;
    return true;
  }
  case 'F': { /* F [Y] <return> <params> E */
    w->s++;
    eat(w, 'Y');
    struct ty ret, p;
    struct span ps[TARGS_MAX];
    size_t n = 0;
    if (!type(w, &ret))
      return false;
    if (w->end - w->s >= 2 && w->s[0] == 'v' && w->s[1] == 'E')
      w->s++;
    while (!eat(w, 'E')) {
      if (n == TARGS_MAX || !type(w, &p))
        return false;
      ps[n++] = p.sp;
    }
    size_t start = w->len;
    if (!put_span(w, ret.sp) || !puts_(w, "("))
      return false;
    for (size_t i = 0; i < n; i++)
      if ((i && !puts_(w, ", ")) || !put_span(w, ps[i]))
        return false;
    if (!puts_(w, ")"))
      return false;
    *out = other(since(w, start));
    return add_sub(w, *out);
  }
  case 'A': { /* A <length> _ <element> */
    w->s++;
    size_t n;
    struct ty el;
    char len[24];
    if (!number(w, &n) || !eat(w, '_') || !type(w, &el))
      return false;
    snprintf(len, sizeof len, "[%zu]", n);
    size_t start = w->len;
    if (!put_span(w, el.sp) || !puts_(w, len))
      return false;
    *out = other(since(w, start));
    return add_sub(w, *out);
  }
  default:
    if (!is_digit(c))
      return false; /* M, R, O, Dp, X, ...: not understood */
    if (!source_name(w, &sp) || !add_sub(w, other(sp)))
      return false;
    *out = other(sp);
    if (eat(w, 'I')) {
      if (!template_args(w, sp, &sp, false))
        return false;
      *out = other(sp);
      return add_sub(w, *out);
    }
    return true;
  }
}

/* One type, its nesting bounded. */
static bool type(struct work *w, struct ty *out) {
  if (w->depth >= CS_SIG_DEPTH)
    return false;
  w->depth++;
  bool ok = type_at(w, out);
  w->depth--;
  return ok;
}

/* The function's name; *tmpl where it is a template's (a return type
 * follows then). */
static bool function_name(struct work *w, bool *tmpl) {
  *tmpl = false;
  if (eat(w, 'N'))
    return nested(w, &w->name, true, tmpl);
  eat(w, 'L'); /* internal linkage */
  struct span nm;
  size_t start = w->len;
  if (w->end - w->s >= 2 && w->s[0] == 'S' && w->s[1] == 't') {
    w->s += 2;
    if (!puts_(w, "std::") || !source_name(w, &nm))
      return false;
    nm = since(w, start);
  } else if (!source_name(w, &nm)) {
    return false;
  }
  if (eat(w, 'I')) {
    if (!add_sub(w, other(nm)) || !template_args(w, nm, &nm, true))
      return false;
    *tmpl = true;
  }
  w->name = nm;
  return true;
}

struct cs_signature *cs_signature_demangle(const char *mangled) {
  if (!mangled || strncmp(mangled, "_Z", 2) != 0)
    return NULL;
  size_t n = strnlen(mangled, CS_SIG_TEXT_MAX + 1);
  if (n > CS_SIG_TEXT_MAX)
    return NULL;
  struct work *w = work_new();
  if (!w)
    return NULL;
  w->s = mangled + 2;
  w->end = mangled + n;
  bool tmpl, ok = function_name(w, &tmpl);
  struct ty t;
  if (ok && tmpl)
    ok = type(w, &t); /* a template's return type */
  if (ok && w->end - w->s == 1 && *w->s == 'v') {
    w->s++; /* no parameters */
  } else {
    ok = ok && w->s < w->end;
    while (ok && w->s < w->end) {
      ok = w->nparams < CS_SIG_PARAMS_MAX && type(w, &t) && !t.is_void;
      if (ok)
        w->params[w->nparams++] = t;
    }
  }
  struct cs_signature *sig = ok ? finish(w) : NULL;
  free(w);
  return sig;
}

/* ---- declared parameter lists -------------------------------------------- */

/* A word of the declaration: [s, s + n). */
struct word {
  const char *s;
  size_t n;
};

static bool word_is(struct word w, const char *s) {
  return strlen(s) == w.n && memcmp(w.s, s, w.n) == 0;
}

static bool word_in(struct word w, const char *const *list) {
  for (; *list; list++)
    if (word_is(w, *list))
      return true;
  return false;
}

static const char *const qualifiers[] = {
    "const",      "volatile",          "restrict", "__restrict__",
    "__restrict", "__grid_constant__", NULL};
static const char *const base_words[] = {
    "signed", "unsigned", "short", "long",   "int",   "char", "float", "double",
    "bool",   "_Bool",    "void",  "struct", "union", "enum", NULL};

static bool is_keyword(struct word w) {
  return word_in(w, qualifiers) || word_in(w, base_words);
}

/* The integer types of <stdint.h>, <stddef.h> and <uchar.h>. */
static const struct {
  const char *name;
  uint8_t size;
} typedefs[] = {
    {"size_t", 8},    {"ssize_t", 8},  {"ptrdiff_t", 8}, {"intptr_t", 8},
    {"uintptr_t", 8}, {"int8_t", 1},   {"uint8_t", 1},   {"int16_t", 2},
    {"uint16_t", 2},  {"int32_t", 4},  {"uint32_t", 4},  {"int64_t", 8},
    {"uint64_t", 8},  {"char16_t", 2}, {"char32_t", 4},  {"wchar_t", 4},
};

/* The type that words[0..n) name, with its spelling in the arena; false
 * where they name none. */
static bool classify(struct work *w, const struct word *words, size_t n,
                     struct ty *out) {
  size_t start = w->len;
  if (n == 2 &&
      (word_is(words[0], "struct") || word_is(words[0], "union") ||
       word_is(words[0], "enum")) &&
      !is_keyword(words[1])) {
    if (!put(w, words[0].s, words[0].n) || !puts_(w, " ") ||
        !put(w, words[1].s, words[1].n))
      return false;
    *out = other(since(w, start));
    return true;
  }
  if (n == 1 && !is_keyword(words[0])) {
    uint8_t cls = CS_TYPE_OTHER, size = 0;
    for (size_t i = 0; i < sizeof typedefs / sizeof typedefs[0]; i++)
      if (word_is(words[0], typedefs[i].name))
        cls = CS_TYPE_INT, size = typedefs[i].size;
    if (!put(w, words[0].s, words[0].n))
      return false;
    *out = (struct ty){cls, size, false, since(w, start)};
    return true;
  }
  enum { SIGNED, UNSIGNED, SHORT, LONG, INT, CHAR, FLOAT, DOUBLE, BOOL, VOID };
  static const char *const names[] = {"signed", "unsigned", "short",
                                      "long",   "int",      "char",
                                      "float",  "double",   NULL};
  int count[VOID + 1] = {0};
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    while (names[k] && !word_is(words[i], names[k]))
      k++;
    if (names[k])
      count[k]++;
    else if (word_is(words[i], "bool") || word_is(words[i], "_Bool"))
      count[BOOL]++;
    else if (word_is(words[i], "void"))
      count[VOID]++;
    else
      return false;
  }
  for (int k = 0; k <= VOID; k++)
    if (count[k] > (k == LONG ? 2 : 1))
      return false;
  int sign = count[SIGNED] + count[UNSIGNED],
      size_words = count[SHORT] + count[LONG];
  size_t others = n - (size_t)count[FLOAT] - (size_t)count[DOUBLE] -
                  (size_t)count[BOOL] - (size_t)count[VOID];
  const char *name;
  uint8_t cls = CS_TYPE_INT, size;
  bool is_void = false;
  if (count[FLOAT] || count[BOOL] || count[VOID]) {
    if (n != 1)
      return false;
    name = count[FLOAT] ? "float" : count[BOOL] ? "bool" : "void";
    cls = count[FLOAT]  ? CS_TYPE_FLOAT
          : count[BOOL] ? CS_TYPE_BOOL
                        : CS_TYPE_OTHER;
    size = count[FLOAT] ? 4 : count[BOOL] ? 1 : 0;
    is_void = count[VOID] != 0;
  } else if (count[DOUBLE]) {
    if (n == 1)
      name = "double", cls = CS_TYPE_DOUBLE, size = 8;
    else if (n == 2 && count[LONG] == 1)
      name = "long double", cls = CS_TYPE_OTHER, size = 0;
    else
      return false;
  } else if (count[CHAR]) {
    if (size_words || count[INT] || sign > 1)
      return false;
    name = count[SIGNED]     ? "signed char"
           : count[UNSIGNED] ? "unsigned char"
                             : "char";
    size = 1;
  } else {
    if (others == 0 || sign > 1 || (count[SHORT] && count[LONG]))
      return false;
    static const char *const ints[2][4] = {
        {"int", "short", "long", "long long"},
        {"unsigned int", "unsigned short", "unsigned long",
         "unsigned long long"}};
    int which = count[SHORT] ? 1 : count[LONG] == 1 ? 2 : count[LONG] ? 3 : 0;
    name = ints[count[UNSIGNED]][which];
    size = which == 0 ? 4 : which == 1 ? 2 : 8;
  }
  if (!puts_(w, name))
    return false;
  *out = (struct ty){cls, size, is_void, since(w, start)};
  return true;
}

/* The next token at *p: a word (identifiers, with "::" inside), '*', or
 * one other byte; n 0 at the end of a parameter (',' or NUL). */
static struct word token(const char **p) {
  const char *s = *p;
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
    s++;
  const char *e = s;
  if (*s == '\0' || *s == ',') {
    *p = s;
    return (struct word){s, 0};
  }
  if (is_ident(*s) && !is_digit(*s)) {
    while (is_ident(*e) || (e[0] == ':' && e[1] == ':' && is_ident(e[2])))
      e += e[0] == ':' ? 2 : 1;
  } else {
    e++;
  }
  *p = e;
  return (struct word){s, (size_t)(e - s)};
}

/* Writes why one parameter is not understood. */
static int refuse(char *why, size_t size, size_t i, const char *fmt,
                  struct word w) {
  char what[64];
  int n = w.n > 40 ? 40 : (int)w.n;
  if (w.n == 1 && ((unsigned char)*w.s < 0x20 || (unsigned char)*w.s >= 0x7f))
    snprintf(what, sizeof what, "\\x%02x", (unsigned char)*w.s);
  else
    snprintf(what, sizeof what, "%.*s%s", n, w.s, w.n > 40 ? "..." : "");
  char text[128];
  snprintf(text, sizeof text, fmt, what);
  snprintf(why, size, "parameter %zu: %s", i, text);
  return 1;
}

#define MAX_WORDS 8
#define MAX_STARS 8

/* One parameter at *p, up to ',' or the end. */
static int declare_param(struct work *w, const char **p, size_t i,
                         struct ty *out, char *why, size_t why_size) {
  struct word words[MAX_WORDS], name = {NULL, 0}, t;
  size_t nwords = 0, stars = 0;
  bool cbase = false, vbase = false, cstar[MAX_STARS] = {false};
  const char *first = NULL;
  while ((t = token(p)).n) {
    if (!first)
      first = t.s;
    if (name.s)
      return refuse(why, why_size, i, "unexpected \"%s\"", t);
    if (t.n == 1 && *t.s == '*') {
      if (nwords == 0 || stars == MAX_STARS)
        return refuse(why, why_size, i, "unexpected \"%s\"", t);
      stars++;
    } else if (!is_ident(*t.s) || is_digit(*t.s)) {
      return refuse(why, why_size, i, "unexpected \"%s\"", t);
    } else if (word_in(t, qualifiers)) {
      bool c = word_is(t, "const"), v = word_is(t, "volatile");
      if (stars)
        cstar[stars - 1] |= c;
      else
        cbase |= c, vbase |= v;
    } else if (stars) {
      if (is_keyword(t))
        return refuse(why, why_size, i, "unexpected \"%s\"", t);
      name = t;
    } else {
      if (nwords == MAX_WORDS)
        return refuse(why, why_size, i, "unexpected \"%s\"", t);
      words[nwords++] = t;
    }
  }
  if (nwords == 0)
    return refuse(why, why_size, i, "no type%s", (struct word){"", 0});
  struct ty base;
  size_t mark = w->len;
  /* Without a '*', the last word may be the parameter's name. */
  if (!stars && nwords >= 2 && !is_keyword(words[nwords - 1]) &&
      classify(w, words, nwords - 1, &base)) {
    nwords--;
  } else {
    w->len = mark;
    if (!classify(w, words, nwords, &base)) {
      const char *end = words[nwords - 1].s + words[nwords - 1].n;
      /* The arena is full, or would be: too long to be read. */
      if (w->len > CS_SIG_TEXT_MAX - 64 ||
          (size_t)(end - words[0].s) > CS_SIG_TEXT_MAX - 64 - w->len)
        return 3;
      return refuse(why, why_size, i, "\"%s\" is not a type",
                    (struct word){words[0].s, (size_t)(end - words[0].s)});
    }
  }
  if (!stars) {
    if (base.is_void)
      return refuse(why, why_size, i, "a parameter cannot be %s",
                    (struct word){"void", 4});
    *out = base;
    return 0;
  }
  size_t start = w->len;
  const char *q = cbase && vbase ? "const volatile "
                  : cbase        ? "const "
                  : vbase        ? "volatile "
                                 : "";
  bool ok = puts_(w, q) && put_span(w, base.sp);
  for (size_t s = 0; ok && s < stars; s++)
    ok = puts_(w, "*") && (!cstar[s] || s + 1 == stars || puts_(w, " const"));
  if (!ok)
    return 3;
  *out = (struct ty){CS_TYPE_POINTER, 8, false, since(w, start)};
  return 0;
}

int cs_signature_declare(struct cs_signature **out, const char *name,
                         size_t name_len, const char *decl, char *why,
                         size_t why_size) {
  *out = NULL;
  struct work *w = work_new();
  if (!w)
    return 2;
  size_t start = w->len;
  int r = put(w, name, name_len) ? 0 : 3;
  w->name = since(w, start);
  const char *p = decl;
  struct word t = token(&p);
  /* "" or "void" alone: no parameters */
  bool none = (t.n == 0 && *p == '\0') ||
              (word_is(t, "void") && token(&p).n == 0 && *p == '\0');
  p = decl;
  if (r == 0 && !none) {
    for (size_t i = 0;; i++) {
      struct ty ty;
      if (w->nparams == CS_SIG_PARAMS_MAX) {
        snprintf(why, why_size, "more than %d parameters", CS_SIG_PARAMS_MAX);
        r = 1;
        break;
      }
      r = declare_param(w, &p, i, &ty, why, why_size);
      if (r)
        break;
      w->params[w->nparams++] = ty;
      if (*p == '\0')
        break;
      p++; /* past the ',' */
    }
  }
  if (r == 0 && !(*out = finish(w)))
    r = 2;
  free(w);
  return r;
}
