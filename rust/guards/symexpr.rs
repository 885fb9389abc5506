//! Symbolic-shape expressions: the integer/boolean expressions of a `ShapeEnv`'s guards
//! (`2 <= s0`, `Eq(s0 * s1, s2)`, `Eq(Mod(s0, 8), 0)`), parsed once from a compact prefix form
//! and evaluated over symbol values read at guard time.
//!
//! Interpreter-free on purpose (no pyo3 type here), so `cargo test` covers parsing, evaluation
//! and rendering. The Python side (`ferrodyn.shape_guards`) serialises each guard to the prefix
//! form; the guard leaf (`shape_leaf.rs`) binds each symbol to an accessor.
//!
//! Prefix form: whitespace-separated tokens. An integer literal (`-3`), a symbol `s<k>` (the
//! k-th binding), `true`/`false`, or an operator followed by its operands:
//! n-ary `add:<n>`, `mul:<n>`, `min:<n>`, `max:<n>`, `and:<n>`, `or:<n>`; binary `floordiv`,
//! `mod`, `pow`, `eq`, `ne`, `lt`, `le`, `gt`, `ge`; unary `not`, `neg`.
//! Arithmetic is Python's (`//` and `%` floor towards negative infinity); booleans are 0/1.
//! Overflow, division by zero and negative powers evaluate to `None`, which fails the guard
//! (a needless recompile, never a wrong hit).
use std::collections::BTreeSet;
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
        }
    }

    fn holds(self, a: i64, b: i64) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NAry {
    Add,
    Mul,
    Min,
    Max,
    And,
    Or,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bin {
    FloorDiv,
    Mod,
    Pow,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Int(i64),
    Sym(usize),
    NAry(NAry, Vec<Expr>),
    Bin(Bin, Box<Expr>, Box<Expr>),
    Cmp(Cmp, Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
}

/// Operator nesting cap: guards are small; a deeper input is an error, not a stack overflow.
const MAX_DEPTH: usize = 200;

impl Expr {
    /// Parse the prefix form (see the module docs). Every token must be used.
    pub fn parse(text: &str) -> Result<Expr, String> {
        let tokens: Vec<&str> = text.split_whitespace().collect();
        let mut pos = 0;
        let e = parse_at(&tokens, &mut pos, 0)?;
        if pos != tokens.len() {
            return Err(format!(
                "trailing tokens after a complete expression: {:?}",
                &tokens[pos..]
            ));
        }
        Ok(e)
    }

    /// The symbols used (binding indices).
    pub fn symbols(&self) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        self.collect(&mut out);
        out
    }

    fn collect(&self, out: &mut BTreeSet<usize>) {
        match self {
            Expr::Int(_) => {}
            Expr::Sym(k) => {
                out.insert(*k);
            }
            Expr::NAry(_, xs) => xs.iter().for_each(|x| x.collect(out)),
            Expr::Bin(_, a, b) | Expr::Cmp(_, a, b) => {
                a.collect(out);
                b.collect(out);
            }
            Expr::Not(a) | Expr::Neg(a) => a.collect(out),
        }
    }

    /// Evaluate with `syms[k]` the value of symbol k. None: overflow, division by zero, a
    /// negative power, or a symbol without a value.
    pub fn eval(&self, syms: &[i64]) -> Option<i64> {
        Some(match self {
            Expr::Int(v) => *v,
            Expr::Sym(k) => *syms.get(*k)?,
            Expr::NAry(op, xs) => {
                let mut it = xs.iter();
                let first = it.next()?.eval(syms)?;
                match op {
                    NAry::And => {
                        if first == 0 {
                            return Some(0);
                        }
                        for x in it {
                            if x.eval(syms)? == 0 {
                                return Some(0);
                            }
                        }
                        1
                    }
                    NAry::Or => {
                        if first != 0 {
                            return Some(1);
                        }
                        for x in it {
                            if x.eval(syms)? != 0 {
                                return Some(1);
                            }
                        }
                        0
                    }
                    _ => {
                        let mut acc = first;
                        for x in it {
                            let v = x.eval(syms)?;
                            acc = match op {
                                NAry::Add => acc.checked_add(v)?,
                                NAry::Mul => acc.checked_mul(v)?,
                                NAry::Min => acc.min(v),
                                NAry::Max => acc.max(v),
                                NAry::And | NAry::Or => unreachable!(),
                            };
                        }
                        acc
                    }
                }
            }
            Expr::Bin(op, a, b) => {
                let (a, b) = (a.eval(syms)?, b.eval(syms)?);
                match op {
                    Bin::FloorDiv => floor_div(a, b)?,
                    Bin::Mod => floor_mod(a, b)?,
                    Bin::Pow => {
                        let e = u32::try_from(b).ok()?;
                        a.checked_pow(e)?
                    }
                }
            }
            Expr::Cmp(op, a, b) => op.holds(a.eval(syms)?, b.eval(syms)?) as i64,
            Expr::Not(a) => (a.eval(syms)? == 0) as i64,
            Expr::Neg(a) => a.eval(syms)?.checked_neg()?,
        })
    }

    /// Whether the expression holds (evaluates to a nonzero value) on `syms`.
    #[inline]
    pub fn holds(&self, syms: &[i64]) -> bool {
        matches!(self.eval(syms), Some(v) if v != 0)
    }

    /// Infix text with `names[k]` for symbol k (Python syntax).
    pub fn render(&self, names: &[String]) -> String {
        let mut s = String::new();
        self.write(names, &mut s, 0);
        s
    }

    fn prec(&self) -> u8 {
        match self {
            Expr::Int(v) if *v < 0 => 6,
            Expr::Int(_) | Expr::Sym(_) => 9,
            Expr::NAry(NAry::Or, _) => 1,
            Expr::NAry(NAry::And, _) => 2,
            Expr::Not(_) => 3,
            Expr::Cmp(..) => 4,
            Expr::NAry(NAry::Add, _) => 5,
            Expr::NAry(NAry::Mul, _) | Expr::Bin(Bin::FloorDiv | Bin::Mod, ..) => 6,
            Expr::Neg(_) => 7,
            Expr::Bin(Bin::Pow, ..) => 8,
            Expr::NAry(NAry::Min | NAry::Max, _) => 9,
        }
    }

    fn write(&self, names: &[String], out: &mut String, ctx: u8) {
        let p = self.prec();
        let paren = p < ctx;
        if paren {
            out.push('(');
        }
        let join = |xs: &[Expr], sep: &str, sub: u8, out: &mut String| {
            for (i, x) in xs.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                x.write(names, out, sub);
            }
        };
        match self {
            Expr::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Expr::Sym(k) => match names.get(*k) {
                Some(n) => out.push_str(n),
                None => {
                    let _ = write!(out, "s{k}");
                }
            },
            Expr::NAry(NAry::Add, xs) => join(xs, " + ", p, out),
            Expr::NAry(NAry::Mul, xs) => {
                // `a * b // c` is `(a * b) // c`, so a later floor-division operand needs
                // parentheses; the first operand sits at the product's own level.
                if let Some((first, rest)) = xs.split_first() {
                    first.write(names, out, p);
                    for x in rest {
                        out.push_str(" * ");
                        x.write(names, out, p + 1);
                    }
                }
            }
            Expr::NAry(NAry::And, xs) => join(xs, " and ", p + 1, out),
            Expr::NAry(NAry::Or, xs) => join(xs, " or ", p + 1, out),
            Expr::NAry(op @ (NAry::Min | NAry::Max), xs) => {
                out.push_str(if *op == NAry::Min { "min(" } else { "max(" });
                join(xs, ", ", 0, out);
                out.push(')');
            }
            Expr::Bin(op, a, b) => {
                let sym = match op {
                    Bin::FloorDiv => " // ",
                    Bin::Mod => " % ",
                    Bin::Pow => " ** ",
                };
                // Left-associative except **: the operand on the associative side needs no
                // parentheses at equal precedence.
                let (la, lb) = if *op == Bin::Pow {
                    (p + 1, p)
                } else {
                    (p, p + 1)
                };
                a.write(names, out, la);
                out.push_str(sym);
                b.write(names, out, lb);
            }
            Expr::Cmp(op, a, b) => {
                a.write(names, out, p + 1);
                let _ = write!(out, " {} ", op.symbol());
                b.write(names, out, p + 1);
            }
            Expr::Not(a) => {
                out.push_str("not ");
                a.write(names, out, p);
            }
            Expr::Neg(a) => {
                out.push('-');
                a.write(names, out, p);
            }
        }
        if paren {
            out.push(')');
        }
    }
}

fn floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q.checked_sub(1)
    } else {
        Some(q)
    }
}

fn floor_mod(a: i64, b: i64) -> Option<i64> {
    let r = a.checked_rem(b)?;
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    })
}

fn parse_at(t: &[&str], pos: &mut usize, depth: usize) -> Result<Expr, String> {
    if depth > MAX_DEPTH {
        return Err(format!("expression nested deeper than {MAX_DEPTH}"));
    }
    let tok = *t
        .get(*pos)
        .ok_or_else(|| "expression ends early (missing operand)".to_string())?;
    *pos += 1;
    let operand = |pos: &mut usize| parse_at(t, pos, depth + 1).map(Box::new);
    if let Ok(v) = tok.parse::<i64>() {
        return Ok(Expr::Int(v));
    }
    match tok {
        "true" => return Ok(Expr::Int(1)),
        "false" => return Ok(Expr::Int(0)),
        _ => {}
    }
    if let Some(k) = tok.strip_prefix('s') {
        if let Ok(k) = k.parse::<usize>() {
            return Ok(Expr::Sym(k));
        }
    }
    if let Some((name, n)) = tok.split_once(':') {
        let op = match name {
            "add" => NAry::Add,
            "mul" => NAry::Mul,
            "min" => NAry::Min,
            "max" => NAry::Max,
            "and" => NAry::And,
            "or" => NAry::Or,
            _ => return Err(format!("unknown n-ary operator {name:?}")),
        };
        let n: usize = n
            .parse()
            .map_err(|_| format!("bad operand count in {tok:?}"))?;
        if n == 0 || n > t.len() {
            return Err(format!("bad operand count in {tok:?}"));
        }
        let xs = (0..n)
            .map(|_| parse_at(t, pos, depth + 1))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Expr::NAry(op, xs));
    }
    let bin = |op: Bin, pos: &mut usize| -> Result<Expr, String> {
        let a = parse_at(t, pos, depth + 1)?;
        let b = parse_at(t, pos, depth + 1)?;
        Ok(Expr::Bin(op, Box::new(a), Box::new(b)))
    };
    let cmp = |op: Cmp, pos: &mut usize| -> Result<Expr, String> {
        let a = parse_at(t, pos, depth + 1)?;
        let b = parse_at(t, pos, depth + 1)?;
        Ok(Expr::Cmp(op, Box::new(a), Box::new(b)))
    };
    match tok {
        "floordiv" => bin(Bin::FloorDiv, pos),
        "mod" => bin(Bin::Mod, pos),
        "pow" => bin(Bin::Pow, pos),
        "eq" => cmp(Cmp::Eq, pos),
        "ne" => cmp(Cmp::Ne, pos),
        "lt" => cmp(Cmp::Lt, pos),
        "le" => cmp(Cmp::Le, pos),
        "gt" => cmp(Cmp::Gt, pos),
        "ge" => cmp(Cmp::Ge, pos),
        "not" => Ok(Expr::Not(operand(pos)?)),
        "neg" => Ok(Expr::Neg(operand(pos)?)),
        _ => Err(format!("unknown token {tok:?}")),
    }
}

/// An expression compiled for guard time: its top-level conjuncts, each as flat postfix code
/// over a small stack (no recursion, no `Option` per node), or kept as a tree where it has
/// nested `and`/`or` (their short-circuit decides whether a failing operand is evaluated) or
/// needs a deeper stack. Evaluates exactly as [`Expr::holds`].
#[derive(Clone, Debug)]
pub struct Program {
    conjuncts: Vec<Conjunct>,
}

#[derive(Clone, Debug)]
enum Conjunct {
    /// The common shapes of a `ShapeEnv` guard (`s0 == s1`, `2 <= s0`, `s2 == s0 * s1`),
    /// evaluated without a stack.
    Cmp(Cmp, Term, Term),
    Flat(Vec<Op>),
    Tree(Expr),
}

/// An operand of a [`Conjunct::Cmp`].
#[derive(Clone, Copy, Debug)]
enum Term {
    Int(i64),
    Sym(usize),
    /// The product of two symbols.
    MulSyms(usize, usize),
    /// A constant times a symbol.
    MulInt(i64, usize),
}

impl Term {
    fn of(e: &Expr) -> Option<Term> {
        Some(match e {
            Expr::Int(v) => Term::Int(*v),
            Expr::Sym(k) => Term::Sym(*k),
            Expr::NAry(NAry::Mul, xs) => match xs.as_slice() {
                [Expr::Sym(a), Expr::Sym(b)] => Term::MulSyms(*a, *b),
                [Expr::Int(c), Expr::Sym(k)] | [Expr::Sym(k), Expr::Int(c)] => Term::MulInt(*c, *k),
                _ => return None,
            },
            _ => return None,
        })
    }

    #[inline(always)]
    fn eval(self, syms: &[i64]) -> Option<i64> {
        match self {
            Term::Int(v) => Some(v),
            Term::Sym(k) => syms.get(k).copied(),
            Term::MulSyms(a, b) => syms.get(a)?.checked_mul(*syms.get(b)?),
            Term::MulInt(c, k) => c.checked_mul(*syms.get(k)?),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Int(i64),
    Sym(usize),
    /// Add/Mul/Min/Max over the top `n` (>= 1) values.
    NAry(NAry, usize),
    Bin(Bin),
    Cmp(Cmp),
    Not,
    Neg,
}

const PROGRAM_STACK: usize = 16;

impl Program {
    pub fn compile(e: &Expr) -> Program {
        let parts: Vec<&Expr> = match e {
            Expr::NAry(NAry::And, xs) if !xs.is_empty() => xs.iter().collect(),
            e => vec![e],
        };
        let conjuncts = parts
            .into_iter()
            .map(|x| {
                if let Expr::Cmp(op, a, b) = x {
                    if let (Some(a), Some(b)) = (Term::of(a), Term::of(b)) {
                        return Conjunct::Cmp(*op, a, b);
                    }
                }
                let mut ops = Vec::new();
                let mut depth = 0;
                let mut max = 0;
                if flatten(x, &mut ops, &mut depth, &mut max) && max <= PROGRAM_STACK {
                    Conjunct::Flat(ops)
                } else {
                    Conjunct::Tree(x.clone())
                }
            })
            .collect();
        Program { conjuncts }
    }

    /// Whether every conjunct holds (same outcome as `Expr::holds` of the whole expression).
    #[inline]
    pub fn holds(&self, syms: &[i64]) -> bool {
        self.conjuncts.iter().all(|c| match *c {
            Conjunct::Cmp(op, a, b) => match (a.eval(syms), b.eval(syms)) {
                (Some(a), Some(b)) => op.holds(a, b),
                _ => false,
            },
            Conjunct::Flat(ref ops) => matches!(run(ops, syms), Some(v) if v != 0),
            Conjunct::Tree(ref e) => e.holds(syms),
        })
    }
}

/// Postfix code for `e` (false where it must stay a tree); tracks the stack depth.
fn flatten(e: &Expr, ops: &mut Vec<Op>, depth: &mut usize, max: &mut usize) -> bool {
    let (op, pops) = match e {
        Expr::Int(v) => (Op::Int(*v), 0),
        Expr::Sym(k) => (Op::Sym(*k), 0),
        Expr::NAry(NAry::And | NAry::Or, _) => return false,
        Expr::NAry(op, xs) => {
            if xs.is_empty() || !xs.iter().all(|x| flatten(x, ops, depth, max)) {
                return false;
            }
            (Op::NAry(*op, xs.len()), xs.len())
        }
        Expr::Bin(op, a, b) => {
            if !flatten(a, ops, depth, max) || !flatten(b, ops, depth, max) {
                return false;
            }
            (Op::Bin(*op), 2)
        }
        Expr::Cmp(op, a, b) => {
            if !flatten(a, ops, depth, max) || !flatten(b, ops, depth, max) {
                return false;
            }
            (Op::Cmp(*op), 2)
        }
        Expr::Not(a) => {
            if !flatten(a, ops, depth, max) {
                return false;
            }
            (Op::Not, 1)
        }
        Expr::Neg(a) => {
            if !flatten(a, ops, depth, max) {
                return false;
            }
            (Op::Neg, 1)
        }
    };
    *depth = *depth + 1 - pops;
    *max = (*max).max(*depth);
    ops.push(op);
    true
}

/// Run flat code (its depth was checked at compile time).
#[inline]
fn run(ops: &[Op], syms: &[i64]) -> Option<i64> {
    let mut st = [0i64; PROGRAM_STACK];
    let mut sp = 0usize;
    for op in ops {
        match *op {
            Op::Int(v) => {
                st[sp] = v;
                sp += 1;
            }
            Op::Sym(k) => {
                st[sp] = *syms.get(k)?;
                sp += 1;
            }
            Op::NAry(op, n) => {
                let base = sp - n;
                let mut acc = st[base];
                for &v in &st[base + 1..sp] {
                    acc = match op {
                        NAry::Add => acc.checked_add(v)?,
                        NAry::Mul => acc.checked_mul(v)?,
                        NAry::Min => acc.min(v),
                        NAry::Max => acc.max(v),
                        NAry::And | NAry::Or => return None, // never compiled flat
                    };
                }
                st[base] = acc;
                sp = base + 1;
            }
            Op::Bin(op) => {
                let (a, b) = (st[sp - 2], st[sp - 1]);
                sp -= 1;
                st[sp - 1] = match op {
                    Bin::FloorDiv => floor_div(a, b)?,
                    Bin::Mod => floor_mod(a, b)?,
                    Bin::Pow => a.checked_pow(u32::try_from(b).ok()?)?,
                };
            }
            Op::Cmp(c) => {
                let (a, b) = (st[sp - 2], st[sp - 1]);
                sp -= 1;
                st[sp - 1] = c.holds(a, b) as i64;
            }
            Op::Not => st[sp - 1] = (st[sp - 1] == 0) as i64,
            Op::Neg => st[sp - 1] = st[sp - 1].checked_neg()?,
        }
    }
    (sp == 1).then_some(st[0])
}

#[cfg(test)]
mod tests {
    use super::{Expr, Program};

    fn ev(text: &str, syms: &[i64]) -> Option<i64> {
        Expr::parse(text).unwrap().eval(syms)
    }

    #[test]
    fn arithmetic_is_pythons() {
        assert_eq!(ev("floordiv -7 2", &[]), Some(-4));
        assert_eq!(ev("floordiv 7 -2", &[]), Some(-4));
        assert_eq!(ev("floordiv 7 2", &[]), Some(3));
        assert_eq!(ev("mod -7 3", &[]), Some(2));
        assert_eq!(ev("mod 7 -3", &[]), Some(-2));
        assert_eq!(ev("mod 6 3", &[]), Some(0));
        assert_eq!(ev("pow s0 3", &[-2]), Some(-8));
        assert_eq!(ev("add:3 s0 s1 -1", &[4, 5]), Some(8));
        assert_eq!(ev("mul:2 s0 s1", &[4, 5]), Some(20));
        assert_eq!(ev("min:3 s0 s1 2", &[4, 5]), Some(2));
        assert_eq!(ev("max:2 s0 s1", &[4, 5]), Some(5));
        assert_eq!(ev("neg s0", &[4]), Some(-4));
    }

    #[test]
    fn failures_are_none() {
        assert_eq!(ev("floordiv s0 0", &[3]), None);
        assert_eq!(ev("mod s0 0", &[3]), None);
        assert_eq!(ev("pow 2 -1", &[]), None);
        assert_eq!(ev("mul:2 s0 s0", &[i64::MAX]), None);
        assert_eq!(ev("floordiv s0 -1", &[i64::MIN]), None);
        assert_eq!(ev("s3", &[1]), None);
        assert!(!Expr::parse("floordiv s0 0").unwrap().holds(&[1]));
    }

    #[test]
    fn booleans() {
        let e = Expr::parse("and:2 le 2 s0 eq mod s0 8 0").unwrap();
        assert!(e.holds(&[16]));
        assert!(!e.holds(&[12]));
        assert!(!e.holds(&[0]));
        assert!(Expr::parse("or:2 eq s0 1 ne s1 3").unwrap().holds(&[5, 4]));
        assert!(Expr::parse("not lt s0 2").unwrap().holds(&[2]));
        assert!(Expr::parse("true").unwrap().holds(&[]));
        assert!(!Expr::parse("false").unwrap().holds(&[]));
        // short-circuit: the failing division is never reached
        assert!(!Expr::parse("and:2 false floordiv 1 0").unwrap().holds(&[]));
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "", "add:2 s0", "eq s0", "s0 s1", "frob 1 2", "add:x 1", "add:0", "sx",
        ] {
            assert!(Expr::parse(bad).is_err(), "{bad:?} parsed");
        }
        let deep = "neg ".repeat(1000) + "1";
        assert!(Expr::parse(&deep).is_err());
    }

    #[test]
    fn render() {
        let names = vec!["L['x'].size()[0]".to_string(), "L['n']".to_string()];
        let r = |t: &str| Expr::parse(t).unwrap().render(&names);
        assert_eq!(r("le 2 s0"), "2 <= L['x'].size()[0]");
        assert_eq!(r("eq mod s0 8 0"), "L['x'].size()[0] % 8 == 0");
        assert_eq!(r("mul:2 add:2 s0 1 s1"), "(L['x'].size()[0] + 1) * L['n']");
        assert_eq!(
            r("floordiv s0 floordiv s1 2"),
            "L['x'].size()[0] // (L['n'] // 2)"
        );
        assert_eq!(
            r("and:2 ge s0 2 not eq s1 3"),
            "L['x'].size()[0] >= 2 and not L['n'] == 3"
        );
        assert_eq!(r("max:2 s0 -1"), "max(L['x'].size()[0], -1)");
        assert_eq!(r("mul:2 -1 s0"), "-1 * L['x'].size()[0]");
        assert_eq!(r("pow pow s0 2 3"), "(L['x'].size()[0] ** 2) ** 3");
        assert_eq!(r("eq s2 1"), "s2 == 1");
    }

    #[test]
    fn comparison_forms_fail_on_overflow() {
        for t in ["eq s0 mul:2 s1 s2", "ne mul:2 s1 s2 s0", "ge mul:2 3 s1 0"] {
            let e = Expr::parse(t).unwrap();
            let p = Program::compile(&e);
            for syms in [[0, i64::MAX, 2], [0, i64::MIN, -1], [6, 2, 3], [5, 2, 3]] {
                assert_eq!(p.holds(&syms), e.holds(&syms), "{t} on {syms:?}");
            }
        }
    }

    #[test]
    fn symbols() {
        let e = Expr::parse("eq mul:2 s0 s2 s0").unwrap();
        assert_eq!(e.symbols().into_iter().collect::<Vec<_>>(), vec![0, 2]);
    }

    #[test]
    fn programs_evaluate_as_trees() {
        let texts = [
            "and:3 le 2 s0 eq s1 mul:2 s0 s2 eq mod s1 8 0",
            "or:2 eq s0 0 gt floordiv s1 s0 1",
            "and:2 or:2 eq s0 0 gt floordiv s1 s0 1 ne s2 3",
            "not lt neg s0 max:3 s1 s2 -4",
            "eq pow s0 s1 s2",
            "eq add:3 s0 s1 9223372036854775807 0",
            "ge min:2 s0 s1 floordiv s2 -3",
            "true",
            // the stackless comparison forms
            "eq s0 s1",
            "le 2 s0",
            "gt s2 -3",
            "eq s2 mul:2 s0 s1",
            "ne mul:2 s1 4 s0",
            "lt mul:2 -3 s2 mul:2 s0 s1",
            "and:3 le 2 s0 eq s1 mul:2 s0 s2 ge s2 s1",
            "eq s5 1",
            "eq s0 mul:2 s1 s7",
        ];
        let mut seed = 12345u64;
        for t in texts {
            let e = Expr::parse(t).unwrap();
            let p = Program::compile(&e);
            for _ in 0..400 {
                let syms: Vec<i64> = (0..3)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((seed >> 33) % 21) as i64 - 10
                    })
                    .collect();
                assert_eq!(p.holds(&syms), e.holds(&syms), "{t} on {syms:?}");
            }
        }
    }
}
