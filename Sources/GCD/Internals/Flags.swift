/// `[.a, .b]` for the named flags set in `flags`, and the unnamed bits in hex:
/// the `description` of the package's option sets.
func describeFlags<Flags: OptionSet>(_ flags: Flags, names: [(Flags, String)]) -> String
where Flags.RawValue == UInt, Flags.Element == Flags {
  var parts = names.filter { flags.contains($0.0) }.map(\.1)
  let known = names.reduce(Flags()) { $0.union($1.0) }
  let unknown = flags.subtracting(known)
  if !unknown.isEmpty { parts.append("0x" + String(unknown.rawValue, radix: 16)) }
  return "[" + parts.joined(separator: ", ") + "]"
}
