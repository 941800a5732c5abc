# mkman.awk -- the manual pages of cusafe from its public headers; run by
# doc/mkman, which sets outdir, version and date.  POSIX awk only: every
# backslash of the output is built by concatenation, never by a gsub()
# replacement, whose handling of backslashes differs between awks.
#
# What it reads, per header: the top comment (the file's description);
# banners, a line of dashes, "/* Title */" and dashes again, which group
# the functions; each CUSAFE_API declaration with the comment that ends on
# the line before it; and every other comment at column 0 (a topic, such
# as "Ordering." or Graphs, for cusafe(7)).

BEGIN {
  nsec = split("Parameters Returns Errors Ownership Handles Threads", SEC, " ")
  for (i = 1; i <= nsec; i++) SECIDX[SEC[i]] = i
  secre = "(Parameters|Returns|Errors|Ownership|Handles|Threads)"
  # Font and quote markers, put in before escaping and turned into roff's
  # escapes after it.
  MB = "\001"; MI = "\002"; MP = "\003"; MLQ = "\004"; MRQ = "\005"
  MEM = "\006"
  BS = "\\"
  nf = 0; nc = 0; nh = 0; nerr = 0; ngroup = 0
}

function err(where, msg) {
  printf "mkman: %s: %s\n", where, msg > "/dev/stderr"
  nerr++
}

function trim(s) {
  sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s)
  return s
}

function basename(p) {
  sub(/.*\//, "", p)
  return p
}

# Literal replacement of every `from' in s.
function repl(s, from, to,    r, i) {
  r = ""
  while ((i = index(s, from)) > 0) {
    r = r substr(s, 1, i - 1) to
    s = substr(s, i + length(from))
  }
  return r s
}

# ---------------------------------------------------------------------------
# Reading the headers
# ---------------------------------------------------------------------------

FNR == 1 {
  hdr = basename(FILENAME)
  HDR[++nh] = hdr
  in_comment = 0; in_decl = 0; pending = 0; dash_line = -10
  banner = ""; banner_line = -10
}

in_decl {
  decl = decl " " $0
  if (index($0, ";")) finish_decl()
  next
}

in_comment {
  t = $0
  closing = index(t, "*/")
  if (closing) t = substr(t, 1, closing - 1)
  if (t ~ /^ \*$/ || t ~ /^ \* /) t = substr(t, 4)
  else if (t ~ /^ *$/) t = ""
  CT[nc, ++CN[nc]] = t
  if (closing) end_comment()
  next
}

/^\/\*/ {
  leave_pending()
  nc++
  CF[nc] = FILENAME; CH[nc] = hdr; CL[nc] = FNR; CN[nc] = 0
  t = substr($0, 3)
  closing = index(t, "*/")
  if (closing) t = substr(t, 1, closing - 1)
  sub(/^ /, "", t)
  CT[nc, ++CN[nc]] = t
  if (closing) end_comment()
  else in_comment = 1
  next
}

/^[ \t]*$/ { leave_pending(); next }

/^CUSAFE_API[ \t]/ {
  if (!pending || pend_line != FNR - 1)
    err(FILENAME ":" FNR, "a CUSAFE_API declaration without a comment just before it: " $0)
  decl = $0; decl_line = FNR; decl_comment = (pending && pend_line == FNR - 1) ? pending : 0
  pending = 0
  in_decl = 1
  if (index($0, ";")) finish_decl()
  next
}

/CUSAFE_API/ && !/^#/ {
  err(FILENAME ":" FNR, "CUSAFE_API not at the start of a declaration's first line: " $0)
  next
}

# A type's name, for italics.
/^typedef / || /^} [A-Za-z_][A-Za-z0-9_]*;/ {
  t = $0
  if (t ~ /;[ \t]*$/ && t !~ /\(/) {
    sub(/;[ \t]*$/, "", t)
    sub(/.*[^A-Za-z0-9_]/, "", t)
    TYPE[t] = 1
  } else if (t ~ /\(\*[A-Za-z_][A-Za-z0-9_]*\)/) {
    match(t, /\(\*[A-Za-z_][A-Za-z0-9_]*\)/)
    TYPE[substr(t, RSTART + 2, RLENGTH - 3)] = 1
  }
}

# The enumerators of cusafe_status, with their comments, for cusafe(7).
/^typedef enum cusafe_status/ { in_status = 1; stext = ""; leave_pending(); next }
in_status && /^}/ { in_status = 0 }
in_status {
  t = $0
  if (t ~ /^ *CUSAFE_[A-Z_]+ = [0-9]+/) {
    name = t; sub(/^ */, "", name); sub(/ .*/, "", name)
    STATUS[++nstatus] = name; STATUS_TEXT[nstatus] = trim(stext); stext = ""
  } else {
    gsub(/\/\*|\*\/|^ *\*/, "", t)
    stext = stext " " trim(t)
  }
  next
}

{ leave_pending() }

function end_comment(    c, s) {
  in_comment = 0
  c = nc
  s = trim(CT[c, 1])
  if (CN[c] == 1 && s ~ /^-+$/) {
    dash_line = FNR; CKIND[c] = "dash"; return
  }
  if (CN[c] == 1 && CL[c] == dash_line + 1) {
    CKIND[c] = "banner"
    banner = s
    GROUP_OF_TITLE[hdr, banner] = ++ngroup
    GTITLE[ngroup] = banner; GHDR[ngroup] = hdr; GN[ngroup] = 0; GT[ngroup] = 0
    cur_group = ngroup
    return
  }
  if (CL[c] == 1) {
    CKIND[c] = "top"; TOP[hdr] = c
    # Functions before the first banner are grouped under the header.
    s = CT[c, 1]; sub(/^[^ ]* -- /, "", s); sub(/\.$/, "", s)
    HSUMMARY[hdr] = s
    ngroup++
    GTITLE[ngroup] = s " (" hdr ")"; GHDR[ngroup] = hdr; GN[ngroup] = 0; GT[ngroup] = 0
    cur_group = ngroup
    return
  }
  pending = c; pend_line = FNR
}

# A comment followed by anything but a declaration is a topic.
function leave_pending() {
  if (!pending) return
  CKIND[pending] = "topic"
  if (CN[pending] > 1) GTOPIC[cur_group, ++GT[cur_group]] = pending
  pending = 0
}

function finish_decl(    d, name, i, depth, c, ret, params) {
  in_decl = 0
  d = decl
  gsub(/[ \t]+/, " ", d)
  sub(/^CUSAFE_API /, "", d)
  sub(/ *;.*/, ";", d)
  gsub(/\( /, "(", d)
  gsub(/ \)/, ")", d)
  if (!match(d, /[A-Za-z_][A-Za-z0-9_]*\(/)) {
    err(FILENAME ":" decl_line, "cannot read the declaration: " d)
    return
  }
  name = substr(d, RSTART, RLENGTH - 1)
  ret = substr(d, 1, RSTART - 1)
  params = substr(d, RSTART + RLENGTH)
  sub(/\);$/, "", params)
  nf++
  FN[nf] = name; FRET[nf] = ret; FPAR[nf] = params; FHDR[nf] = hdr
  FWHERE[nf] = FILENAME ":" decl_line; FCOM[nf] = decl_comment
  FUNC[name] = nf
  FGROUP[nf] = cur_group
  GF[cur_group, ++GN[cur_group]] = nf
}

# ---------------------------------------------------------------------------
# Comments into description and sections
# ---------------------------------------------------------------------------

# Splits function f's comment into DESC[f] (lines joined, paragraphs
# separated by "\n") and S[f, section]; reports what is missing.
function parse_comment(f,    c, i, t, cur, names, k, n, m, last, idx, text, j) {
  c = FCOM[f]
  if (!c) return
  cur = ""; last = 0
  for (i = 1; i <= CN[c]; i++) {
    t = CT[c, i]
    if (t ~ ("^" secre "(, " secre ")*: ")) {
      names = substr(t, 1, index(t, ":") - 1)
      text = substr(t, index(t, ":") + 2)
      n = split(names, m, ", ")
      cur = ""
      for (k = 1; k <= n; k++) {
        idx = SECIDX[m[k]]
        if ((f, m[k]) in S)
          err(FWHERE[f], FN[f] ": its comment has two " m[k] ": sections")
        else if (idx < last)
          err(FWHERE[f], FN[f] ": " m[k] ": comes after " SEC[last] ": in its comment (the order is " SEC[1] ", " SEC[2] ", " SEC[3] ", " SEC[4] ", " SEC[5] ", " SEC[6] ")")
        last = idx
        S[f, m[k]] = ""
        cur = cur (cur == "" ? "" : SUBSEP) m[k]
      }
      t = text
    }
    if (t ~ ("[.;:)] +" secre ": ") || t ~ ("^ +" secre ": "))
      err(FWHERE[f], FN[f] ": a section of its comment does not start a line: " trim(t))
    if (cur == "") {
      DESC_L[f, ++DESC_N[f]] = t
    } else {
      n = split(cur, m, SUBSEP)
      for (k = 1; k <= n; k++) SL[f, m[k], ++SN[f, m[k]]] = t
    }
  }
  for (k = 1; k <= nsec; k++) {
    if (!((f, SEC[k]) in S)) {
      err(FWHERE[f], FN[f] ": its comment has no " SEC[k] ": section")
      continue
    }
    n = SN[f, SEC[k]]
    for (j = 1; j <= n; j++) TMP[j] = SL[f, SEC[k], j]
    S[f, SEC[k]] = join(TMP, n)
    if (trim(S[f, SEC[k]]) == "")
      err(FWHERE[f], FN[f] ": the " SEC[k] ": section of its comment is empty")
  }
  for (j = 1; j <= DESC_N[f]; j++) TMP[j] = DESC_L[f, j]
  DESC[f] = join(TMP, DESC_N[f])
  if (trim(DESC[f]) == "")
    err(FWHERE[f], FN[f] ": its comment has no description before Parameters:")
}

# Joins comment lines: a blank line ends a paragraph ("\n"); two spaces
# mark the end of a sentence, as in the headers.
function join(L, n,    i, t, r, prev) {
  r = ""; prev = ""
  for (i = 1; i <= n; i++) {
    t = trim(L[i])
    if (t == "") {
      if (r != "" && r !~ /\n$/) r = r "\n"
      prev = ""
      continue
    }
    if (prev == "") r = r t
    else if (prev ~ /[^.]\.[)"']?$/ || prev ~ /[?!][)"']?$/) r = r "  " t
    else r = r " " t
    prev = t
  }
  sub(/\n+$/, "", r)
  return r
}

# The parameters named in a prototype.
function param_names(p, A,    n, i, m, k, x) {
  n = split_params(p, m)
  k = 0
  for (i = 1; i <= n; i++) {
    x = m[i]
    if (x == "void" || x == "...") continue
    sub(/\[[^]]*\]$/, "", x)
    if (match(x, /[A-Za-z_][A-Za-z0-9_]*$/)) A[++k] = substr(x, RSTART, RLENGTH)
  }
  return k
}

# Splits a parameter list at its top-level commas.
function split_params(p, A,    n, i, c, depth, cur) {
  n = 0; depth = 0; cur = ""
  for (i = 1; i <= length(p); i++) {
    c = substr(p, i, 1)
    if (c == "(") depth++
    if (c == ")") depth--
    if (c == "," && depth == 0) { A[++n] = trim(cur); cur = ""; continue }
    cur = cur c
  }
  if (trim(cur) != "") A[++n] = trim(cur)
  return n
}

function check_params(f,    n, A, i, p) {
  p = S[f, "Parameters"]
  if (p ~ /^as /) return
  n = param_names(FPAR[f], A)
  if (n == 0 && p !~ /^none/)
    err(FWHERE[f], FN[f] ": takes no parameters, but its Parameters: section is not \"none.\"")
  for (i = 1; i <= n; i++)
    if (index(p, A[i] " [") == 0)
      err(FWHERE[f], FN[f] ": its Parameters: section does not describe " A[i] " (\"" A[i] " [in]\", \"[out]\" or \"[in,out]\")")
}

# The one-line summary: the first sentence; where that is long, without
# its parentheses and cut at a colon, dash, semicolon or ", so that".
function summary(f,    s, i, cut, k, seps, m) {
  s = DESC[f]
  sub(/\n.*/, "", s)
  if ((i = index(s, "  ")) > 0) s = substr(s, 1, i - 1)
  sub(/\.$/, "", s)
  gsub(/`/, "", s)
  if (length(s) > 60) {
    s = repl(s, "()", "\007")
    while (match(s, / \([^()]+\)/)) s = substr(s, 1, RSTART - 1) substr(s, RSTART + RLENGTH)
    s = repl(s, "\007", "()")
    cut = 0
    k = split(": | -- |; |, so that |, such as |, also ", seps, "|")
    for (i = 1; i <= k; i++) {
      m = index(s, seps[i])
      if (m > 10 && (cut == 0 || m < cut)) cut = m
    }
    if (cut) s = substr(s, 1, cut - 1)
  }
  if (s ~ /^[A-Z]([a-z]| )/) s = tolower(substr(s, 1, 1)) substr(s, 2)
  return s
}

# ---------------------------------------------------------------------------
# Text into roff
# ---------------------------------------------------------------------------

function isidch(c) { return c ~ /[A-Za-z0-9_]/ }

# Marks the fonts of identifiers and code spans.
function markup(s,    r, i, n, c, j, id, inner, prevc) {
  r = ""; n = length(s); prevc = ""
  for (i = 1; i <= n; i++) {
    c = substr(s, i, 1)
    if (c == "`" && (j = index(substr(s, i + 1), "`")) > 0) {
      inner = substr(s, i + 1, j - 1)
      if (inner ~ /^[A-Za-z_][A-Za-z0-9_]*$/) r = r MI inner MP
      else r = r MLQ inner MRQ
      i += j; prevc = "`"
      continue
    }
    if (c ~ /[A-Za-z_]/ && !isidch(prevc)) {
      j = i
      while (j < n && isidch(substr(s, j + 1, 1))) j++
      id = substr(s, i, j - i + 1)
      r = r font(id, substr(s, j + 1, 3))
      i = j; prevc = substr(s, j, 1)
      continue
    }
    r = r c; prevc = c
  }
  return r
}

function font(id, after) {
  if (id in FUNC) { SEEN[id] = 1; return MB id MP }
  if (id == "cusafe" && after == "(7)") return MB id MP
  if (id ~ /^CUSAFE_[A-Z0-9_]*$/ || id ~ /^kDL[A-Za-z]+$/ || id == "NULL")
    return MB id MP
  if (id in TYPE || id ~ /^DL[A-Z][A-Za-z]*$/ || id ~ /_t$/ || id == "PyObject")
    return MI id MP
  return id
}

# Escapes marked text for roff: backslashes, dashes, hyphens that are
# minus signs or options, then the markers.
function escape(s,    r, i, n, c, prevc, nextc, opt) {
  s = repl(s, " -- ", " " MEM " ")
  r = ""; n = length(s); prevc = " "; opt = 0
  for (i = 1; i <= n; i++) {
    c = substr(s, i, 1)
    nextc = substr(s, i + 1, 1)
    if (c == BS) { r = r BS "e"; prevc = c; continue }
    if (c == "-") {
      if (prevc ~ /[ (\[\/"=]/ || prevc == MB || prevc == MI || prevc == MLQ) opt = 1
      if (opt || prevc == "-" || nextc ~ /[0-9]/) r = r BS "-"
      else r = r "-"
      prevc = c; continue
    }
    if (c == " ") opt = 0
    r = r c; prevc = c
  }
  r = repl(r, MB, BS "fB"); r = repl(r, MI, BS "fI"); r = repl(r, MP, BS "fP")
  r = repl(r, MLQ, BS "(lq"); r = repl(r, MRQ, BS "(rq"); r = repl(r, MEM, BS "(em")
  return r
}

# A line of text, safe from being read as a request.
function line(s) {
  s = escape(markup(s))
  if (s ~ /^[.']/) s = BS "&" s
  return s
}

# Prints a line of text as lines of at most 80 bytes where it has spaces
# to break at.
function wrap(s, file,    i, j) {
  while (length(s) > 80) {
    j = 0
    for (i = 81; i > 1; i--) if (substr(s, i, 1) == " ") { j = i; break }
    if (!j) { j = index(s, " "); if (!j) break }
    print substr(s, 1, j - 1) > file
    s = substr(s, j + 1)
    if (s ~ /^[.']/) s = BS "&" s
  }
  print s > file
}

# What the function comments say of "this file" is said in cusafe(7).
function refs(s) {
  s = repl(s, "the top of this file", "cusafe(7)")
  s = repl(s, "the top of cusafe.h", "cusafe(7)")
  s = repl(s, "Releases at the top", "Releases in cusafe(7)")
  s = repl(s, "see the top for", "see cusafe(7) for")
  s = repl(s, "\" above", "\" in cusafe(7)")
  s = repl(s, "\" below", "\" in cusafe(7)")
  s = repl(s, "(see Graphs)", "(see Graphs in cusafe(7))")
  s = repl(s, "see Graphs)", "see Graphs in cusafe(7))")
  return s
}

function capital(s, f,    w) {
  w = s; sub(/[^A-Za-z].*/, "", w)
  if (s !~ /^[a-z]/ || w ~ /^cusafe/ || (f && index(" " FPNAMES[f] " ", " " w " "))) return s
  return toupper(substr(s, 1, 1)) substr(s, 2)
}

# Writes a text: one sentence per line, .PP between paragraphs; a
# sentence that matches `brk' starts a paragraph of its own.
function emit(text, file, brk,    P, np, p, Q, nq, q, first) {
  np = split(text, P, "\n")
  first = 1
  for (p = 1; p <= np; p++) {
    if (!first) print ".PP" > file
    first = 0
    nq = split(P[p], Q, "  ")
    for (q = 1; q <= nq; q++) {
      if (trim(Q[q]) == "") continue
      if (q > 1 && brk != "" && Q[q] ~ brk) print ".PP" > file
      wrap(line(trim(Q[q])), file)
    }
  }
}

# The prototype as .BI lines: bold but the parameters' names, which are
# italic; continuation lines aligned after the parenthesis, or indented
# where that is far.
function synopsis(f, file,    head, ind, n, P, i, x, name, type, tail, pad, k, w) {
  head = FRET[f] FN[f] "("
  n = split_params(FPAR[f], P)
  if (n == 1 && P[1] == "void") {
    print ".B \"" head "void);\"" > file
    return
  }
  ind = length(head); pad = ""; NS = 0
  push(head, "B"); w = ind
  if (ind > 40) { ind = 4; flush(file); w = 0 }
  for (k = 0; k < ind; k++) pad = pad " "
  for (i = 1; i <= n; i++) {
    x = P[i]
    if (x !~ /\(/ && match(x, /[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?$/)) {
      type = substr(x, 1, RSTART - 1); name = substr(x, RSTART)
    } else {
      type = x; name = ""
    }
    tail = (i < n) ? "," : ");"
    if (NS > 0 && (w + 1 + length(x) + length(tail) > 72 || NS >= 7)) {
      flush(file); w = 0
    }
    if (NS == 0) { push(pad type, "B"); w = ind + length(type) }
    else if (i == 1) { push(type, "B"); w += length(type) }
    else { push(" " type, "B"); w += 1 + length(type) }
    if (name != "") { push(name, "I"); w += length(name) }
    push(tail, "B"); w += length(tail)
  }
  flush(file)
}

function push(text, ft) {
  if (NS > 0 && SFONT[NS] == ft) SEG[NS] = SEG[NS] text
  else { SEG[++NS] = text; SFONT[NS] = ft }
}

function flush(file,    i, s) {
  if (NS == 0) return
  s = (NS == 1) ? ".B" : ".BI"
  for (i = 1; i <= NS; i++) s = s " \"" SEG[i] "\""
  print s > file
  NS = 0
}

# ---------------------------------------------------------------------------
# The pages
# ---------------------------------------------------------------------------

function th(file, title, sec, hdrname) {
  print ".\\\" Written by doc/mkman from " hdrname "; edit the header, not this page." > file
  print ".TH " title " " sec " \"" date "\" \"cusafe " version "\" \"cusafe Manual\"" > file
  print ".nh" > file
  print ".ad l" > file
}

function linking(file) {
  print ".PP" > file
  print "Compile and link with" > file
  print ".BR \"pkg\\-config \\-\\-cflags \\-\\-libs cusafe\" ;" > file
  print "with CMake," > file
  print ".B \"find_package(cusafe)\"" > file
  print "and the imported target" > file
  print ".BR cusafe::cusafe ." > file
}

function params_section(f, file,    p, re, rest, n, NAME, DIR, BODY, pre, tag, i, b) {
  p = S[f, "Parameters"]
  if (p ~ /^none\.?$/) { print "None." > file; return }
  if (p ~ /^as /) { emit(capital(refs(p), f), file, ""); return }
  re = "(^|; )[A-Za-z_][A-Za-z0-9_]* \\[(in|out|in,out)\\]"
  rest = p; n = 0; pre = ""
  while (match(rest, re)) {
    if (n == 0) pre = substr(rest, 1, RSTART - 1)
    else BODY[n] = BODY[n] substr(rest, 1, RSTART - 1)
    tag = substr(rest, RSTART, RLENGTH)
    sub(/^; /, "", tag)
    n++
    NAME[n] = substr(tag, 1, index(tag, " ") - 1)
    DIR[n] = substr(tag, index(tag, "["))
    BODY[n] = ""
    rest = substr(rest, RSTART + RLENGTH)
  }
  if (n == 0) { emit(capital(refs(p), f), file, ""); return }
  BODY[n] = BODY[n] rest
  if (trim(pre) != "") emit(capital(refs(trim(pre)), f), file, "")
  for (i = 1; i <= n; i++) {
    b = trim(BODY[i])
    if (b !~ /[.)]$/) b = b "."
    print ".TP" > file
    print ".I " NAME[i] > file
    emit(DIR[i] " " refs(b), file, "")
  }
}

function see_also(f, file,    noun, k, L, n, i, j, x) {
  noun = FN[f]; sub(/^cusafe_/, "", noun); sub(/_.*/, "", noun)
  if (FN[f] == "cusafe_retain") SEEN["cusafe_release"] = 1
  if (FN[f] == "cusafe_release") SEEN["cusafe_retain"] = 1
  if (("cusafe_" noun "_retain") in FUNC) SEEN["cusafe_" noun "_retain"] = 1
  if (("cusafe_" noun "_release") in FUNC) SEEN["cusafe_" noun "_release"] = 1
  n = 0
  for (k in SEEN) if (k != FN[f]) L[++n] = k
  for (i = 2; i <= n; i++) {
    x = L[i]
    for (j = i - 1; j >= 1 && L[j] > x; j--) L[j + 1] = L[j]
    L[j + 1] = x
  }
  for (i = 1; i <= n; i++) print ".BR " L[i] " (3)," > file
  print ".BR cusafe (7)" > file
}

function function_page(f,    file, k, brk) {
  file = outdir "/" FN[f] ".3"
  for (k in SEEN) delete SEEN[k]
  th(file, toupper(FN[f]), 3, "include/" FHDR[f])
  print ".SH NAME" > file
  print FN[f] " " BS "- " escape(summary(f)) > file
  print ".SH SYNOPSIS" > file
  print ".nf" > file
  print ".B #include <" FHDR[f] ">" > file
  print ".PP" > file
  synopsis(f, file)
  print ".fi" > file
  linking(file)
  print ".SH DESCRIPTION" > file
  emit(refs(DESC[f]), file, "")
  print ".SH PARAMETERS" > file
  params_section(f, file)
  brk = "^(CUSAFE_|A CUDA failure|Where this release|After shutdown|[*]|.* on (every )?failure)"
  print ".SH \"RETURN VALUE\"" > file
  emit(capital(refs(S[f, "Returns"]), f), file, brk)
  print ".SH ERRORS" > file
  emit(capital(refs(S[f, "Errors"]), f), file, brk)
  print ".SH OWNERSHIP" > file
  emit(capital(refs(S[f, "Ownership"]), f), file, "")
  print ".SH HANDLES" > file
  emit(capital(refs(S[f, "Handles"]), f), file, "")
  print ".SH \"THREAD SAFETY\"" > file
  emit(capital(refs(S[f, "Threads"]), f), file, "")
  print ".SH \"SEE ALSO\"" > file
  see_also(f, file)
  close(file)
  PAGES = PAGES FN[f] ".3 " FHDR[f] "\n"
}

# A comment's text from its line `from' on; a line that starts a section
# (Parameters: ...) starts a paragraph.
function comment_text(c, from,    i, n, t) {
  n = 0
  for (i = from; i <= CN[c]; i++) {
    t = CT[c, i]
    if (t ~ ("^" secre "(, " secre ")*: ") && n > 0) TMP[++n] = ""
    TMP[++n] = t
  }
  return join(TMP, n)
}

# The top comment of cusafe.h: "Word: ..." paragraphs lead with the word
# in bold, "- Word: ..." items are a list.
function top_description(c, file,    text, P, np, p, t, tag, first) {
  text = comment_text(c, 2)
  np = split(text, P, "\n")
  for (p = 1; p <= np; p++) {
    t = P[p]
    if (t ~ /^- [A-Z][A-Za-z ]*: /) {
      tag = substr(t, 3, index(t, ":") - 3)
      print ".TP" > file
      print ".B " escape(tag) > file
      emit(capital(substr(t, index(t, ":") + 2)), file, "")
      continue
    }
    if (p > 1) print ".PP" > file
    if (t ~ /^[A-Z][a-z]+: /) t = MB substr(t, 1, index(t, ":")) MP substr(t, index(t, ":") + 1)
    emit(t, file, "")
  }
}

function topic(c, from, file, first) {
  if (!first) print ".PP" > file
  emit(comment_text(c, from), file, "")
}

function overview(    file, g, i, f, c, n, k, L, x, j, P, np, p, v, VAR, VTEXT, VF, nv, m) {
  file = outdir "/cusafe.7"
  th(file, "CUSAFE", 7, "include/" HDR[1])
  print ".SH NAME" > file
  print "cusafe " BS "- " escape(HSUMMARY[HDR[1]]) > file
  print ".SH SYNOPSIS" > file
  print ".nf" > file
  for (i = 1; i <= nh; i++) print ".B #include <" HDR[i] ">" > file
  print ".fi" > file
  linking(file)
  print ".SH DESCRIPTION" > file
  top_description(TOP[HDR[1]], file)

  print ".SH FUNCTIONS" > file
  print "Each function has its page, with its parameters, return value," > file
  print "errors, ownership, handles and thread safety." > file
  for (g = 1; g <= ngroup; g++) {
    if (GN[g] == 0) continue
    print ".SS \"" escape(GTITLE[g]) "\"" > file
    for (i = 1; i <= GN[g]; i++) {
      f = GF[g, i]
      print ".TP" > file
      print ".BR " FN[f] " (3)" > file
      print escape(summary(f)) > file
    }
  }

  if (nstatus > 0) {
    print ".SH \"STATUS CODES\"" > file
    print "The values of" > file
    print ".IR cusafe_status ;" > file
    print ".BR cusafe_status_string (3)" > file
    print "describes each in words." > file
    for (i = 1; i <= nstatus; i++) {
      print ".TP" > file
      print ".B " STATUS[i] > file
      print line(STATUS_TEXT[i] == "" ? "The call succeeded." : STATUS_TEXT[i]) > file
    }
  }

  print ".SH DETAILS" > file
  print "What the headers say beside the functions, by their sections." > file
  for (g = 1; g <= ngroup; g++) {
    c = (GHDR[g] != HDR[1] && GTITLE[g] == HSUMMARY[GHDR[g]] " (" GHDR[g] ")") ? TOP[GHDR[g]] : 0
    if (GT[g] == 0 && !c) continue
    print ".SS \"" escape(GTITLE[g]) "\"" > file
    if (c) topic(c, 2, file, 1)
    for (i = 1; i <= GT[g]; i++) topic(GTOPIC[g, i], 1, file, i == 1 && !c)
  }

  # Environment variables: NAME=value in a paragraph that speaks of the
  # environment.
  nv = 0
  for (f = 1; f <= nf; f++) {
    np = split(DESC[f], P, "\n")
    for (p = 1; p <= np; p++) {
      if (P[p] !~ /environment/) continue
      x = P[p]
      while (match(x, /CUSAFE_[A-Z0-9_]+=/)) {
        v = substr(x, RSTART, RLENGTH - 1)
        if (!(v in VAR)) { VAR[v] = ++nv; VTEXT[nv] = P[p]; VF[nv] = f; VNAME[nv] = v }
        x = substr(x, RSTART + RLENGTH)
      }
    }
  }
  if (nv > 0) {
    print ".SH ENVIRONMENT" > file
    for (i = 1; i <= nv; i++) {
      print ".TP" > file
      print ".B " VNAME[i] > file
      print "Read by" > file
      print ".BR " FN[VF[i]] " (3):" > file
      emit(VTEXT[i], file, "")
    }
  }

  print ".SH \"SEE ALSO\"" > file
  n = 0
  for (f = 1; f <= nf; f++) L[++n] = FN[f]
  for (i = 2; i <= n; i++) {
    x = L[i]
    for (j = i - 1; j >= 1 && L[j] > x; j--) L[j + 1] = L[j]
    L[j + 1] = x
  }
  for (i = 1; i <= n; i++) print ".BR " L[i] " (3)" (i < n ? "," : "") > file
  close(file)
}

END {
  if (in_comment) err(FILENAME, "a comment does not end")
  if (in_decl) err(FILENAME ":" decl_line, "a declaration does not end")
  if (nf == 0) err("headers", "no CUSAFE_API declarations found")
  for (i = 1; i <= nh; i++)
    if (!(HDR[i] in TOP)) err(HDR[i], "no top comment (\"NAME -- what it is.\") on its first line")
  for (f = 1; f <= nf; f++) {
    if (!FCOM[f]) continue
    parse_comment(f)
    if ((f, "Parameters") in S) check_params(f)
    n = param_names(FPAR[f], A)
    FPNAMES[f] = ""
    for (i = 1; i <= n; i++) FPNAMES[f] = FPNAMES[f] " " A[i]
  }
  if (nerr > 0) {
    printf "mkman: %d problem(s); no pages written\n", nerr > "/dev/stderr"
    exit 1
  }
  PAGES = ""
  for (f = 1; f <= nf; f++) function_page(f)
  overview()
  file = outdir "/pages"
  printf "%scusafe.7 -\n", PAGES > file
  close(file)
}
