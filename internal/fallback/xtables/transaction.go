package xtables

import (
	"bytes"
	"strings"
)

// Tables the fallback dataplanes write to, in the order a transaction
// commits them. Cleanup looks for our chains in these. The iptables
// dataplane uses filter and nat; the IPVS dataplane also mangle, whose
// hooks run before IPVS.
var Tables = []string{"filter", "nat", "mangle"}

// Builtin lists the built-in chains of each table we hook into or may have
// hooked into in an earlier version or another mode.
var Builtin = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
}

// Rule joins the words of a rule spec (everything after "-A CHAIN"),
// quoting words with spaces the way iptables-save does, so that the text is
// both valid restore input and what the kernel later shows.
func Rule(words ...string) string {
	var b strings.Builder
	for i, w := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		if w == "" || strings.ContainsAny(w, " \t\"") {
			b.WriteByte('"')
			b.WriteString(strings.ReplaceAll(w, `"`, `\"`))
			b.WriteByte('"')
		} else {
			b.WriteString(w)
		}
	}
	return b.String()
}

// Words splits a rule spec as iptables-restore does: on blanks, with double
// quotes grouping and backslash escaping the next character inside them.
func Words(spec string) []string {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(spec); i++ {
		c := spec[i]
		switch {
		case quoted && c == '\\' && i+1 < len(spec):
			i++
			cur.WriteByte(spec[i])
		case c == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (c == ' ' || c == '\t'):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// Target returns the chain or target a rule spec jumps or goes to, "" if
// none.
func Target(spec string) string {
	w := Words(spec)
	for i := len(w) - 2; i >= 0; i-- {
		if w[i] == "-j" || w[i] == "-g" || w[i] == "--jump" || w[i] == "--goto" {
			return w[i+1]
		}
	}
	return ""
}

// Transaction is the input of one iptables-restore run. Tables are written
// in the order of Tables; within a table, chain declarations (which create
// or flush a chain) come first, then rule lines in the order they were
// added, then chain deletions.
type Transaction struct {
	tables map[string]*TableTx
}

// TableTx is one table's part of a transaction.
type TableTx struct {
	chains  []string
	lines   []string
	deletes []string
	rules   int
}

// Table returns the part of the transaction for table, creating it.
func (tx *Transaction) Table(table string) *TableTx {
	if tx.tables == nil {
		tx.tables = map[string]*TableTx{}
	}
	t := tx.tables[table]
	if t == nil {
		t = &TableTx{}
		tx.tables[table] = t
	}
	return t
}

// Chain declares chain: it is created, or flushed if it exists.
func (t *TableTx) Chain(chain string) { t.chains = append(t.chains, chain) }

// Append adds spec at the end of chain.
func (t *TableTx) Append(chain, spec string) {
	t.lines = append(t.lines, "-A "+chain+" "+spec)
	t.rules++
}

// Insert adds spec at the top of chain.
func (t *TableTx) Insert(chain, spec string) {
	t.lines = append(t.lines, "-I "+chain+" 1 "+spec)
	t.rules++
}

// Delete removes the first rule of chain that matches spec. The whole
// transaction fails if there is none.
func (t *TableTx) Delete(chain, spec string) {
	t.lines = append(t.lines, "-D "+chain+" "+spec)
}

// DeleteChain deletes chain after every rule line has been applied. The
// chain must also be declared (flushed) and no longer referenced.
func (t *TableTx) DeleteChain(chain string) { t.deletes = append(t.deletes, chain) }

// Rules returns how many rules the table's part writes (appends and
// inserts), for kubeproxy_sync_proxy_rules_iptables_last.
func (t *TableTx) Rules() int { return t.rules }

// Empty reports whether the table's part changes nothing.
func (t *TableTx) Empty() bool {
	return len(t.chains) == 0 && len(t.lines) == 0 && len(t.deletes) == 0
}

// Empty reports whether the transaction changes nothing.
func (tx *Transaction) Empty() bool {
	for _, t := range tx.tables {
		if !t.Empty() {
			return false
		}
	}
	return true
}

// Rules returns how many rules table's part writes (0 if absent).
func (tx *Transaction) Rules(table string) int {
	if t := tx.tables[table]; t != nil {
		return t.rules
	}
	return 0
}

// Bytes renders the transaction as iptables-restore input. Tables with no
// change are left out: even an empty COMMIT makes the legacy back end
// replace the whole table.
func (tx *Transaction) Bytes() []byte {
	var b bytes.Buffer
	for _, name := range Tables {
		t := tx.tables[name]
		if t == nil || t.Empty() {
			continue
		}
		b.WriteString("*" + name + "\n")
		for _, c := range t.chains {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, l := range t.lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		for _, c := range t.deletes {
			b.WriteString("-X " + c + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}
