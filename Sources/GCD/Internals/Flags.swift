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

/// Stops the process, naming `operation`, when `flags` has bits beside `known`: option-set bits the
/// package does not name exist only through `init(rawValue:)` with numbers of one's own, a
/// programmer error (docs/architecture.md, "Errors and misuse"). The one check of every option set
/// the package hands to libdispatch or the kernel.
func requireKnownBits<Flags: OptionSet>(
  _ flags: Flags, of known: Flags, _ operation: @autoclosure () -> String, _ noSuch: StaticString
) where Flags.RawValue == UInt, Flags.Element == Flags {
  if flags.isSubset(of: known) { return }
  fatalError("GCD: \(operation()): \(noSuch) (bits 0x\(String(flags.subtracting(known).rawValue, radix: 16)))")
}
