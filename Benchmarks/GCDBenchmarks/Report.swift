#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Output: an aligned table for people, `op=… variant=…` lines or JSON for
// programs, and an SVG bar chart of the ratios.

/// A number with as many decimals as its size deserves.
func format(_ value: Double) -> String {
  if value.isNaN { return "-" }
  let magnitude = abs(value)
  let decimals = magnitude >= 100 ? 0 : magnitude >= 10 ? 1 : 2
  return fixed(value, decimals)
}

/// `value` with exactly `decimals` decimals.
func fixed(_ value: Double, _ decimals: Int) -> String {
  var scale = 1.0
  for _ in 0..<decimals { scale *= 10 }
  let scaled = (abs(value) * scale).rounded()
  let whole = Int(scaled / scale)
  var text = (value < 0 && scaled > 0 ? "-" : "") + String(whole)
  if decimals > 0 {
    let fraction = Int(scaled - Double(whole) * scale)
    let digits = String(fraction)
    text += "." + String(repeating: "0", count: decimals - digits.count) + digits
  }
  return text
}

/// Rows of cells as text columns: the first `leftAligned` columns
/// left-aligned, the rest right-aligned.
func alignedTable(_ rows: [[String]], leftAligned: Int = 1) -> String {
  let columns = rows.map(\.count).max() ?? 0
  var widths = [Int](repeating: 0, count: columns)
  for row in rows {
    for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) }
  }
  return rows.map { row in
    row.enumerated().map { index, cell in
      let padding = String(repeating: " ", count: widths[index] - cell.count)
      return index < leftAligned ? cell + padding : padding + cell
    }.joined(separator: "  ").reversed().drop { $0 == " " }.reversed()
  }.map { String($0) }.joined(separator: "\n")
}

struct Report {
  let machine: Machine
  let repeats: Int
  let quick: Bool
  let results: [BenchmarkResult]
  let objects: [ObjectMemory]
  let objectCount: Int
  /// Why the heap table is missing, if it is.
  let objectsMissing: String?
  let rss: [RSSResult]

  // MARK: Table

  var table: String {
    var text = "GCDBenchmarks — \(machine.summary)\n"
    text +=
      quick
      ? "--quick: one run of each variant with a tiny count (a smoke test; the numbers mean nothing)\n\n"
      : "median and min of \(repeats) runs per variant, interleaved, after one warm-up run each "
        + "(timer_lateness 3 runs, event_latency 5); allocs: heap allocations per operation, every "
        + "thread's, the median over the runs (Benchmarks/CBenchAllocations)\n\n"
    if !results.isEmpty {
      var rows = [
        [
          "operation", "unit", "C median", "C min", "GCD median", "GCD min", "Dispatch median", "Dispatch min",
          "GCD/C", "GCD/Dispatch", "C allocs", "GCD allocs", "Dispatch allocs",
        ]
      ]
      for result in results {
        var row = [result.benchmark.name, result.benchmark.unit]
        for variant in Variant.allCases {
          let measurement = result.measurements[variant]
          if let median = measurement?.median, let minimum = measurement?.minimum {
            row += [format(median), format(minimum)]
          } else {
            let reason = measurement?.unavailable ?? "-"
            row += [reason.hasPrefix("n/a") ? "n/a" : reason, ""]
          }
        }
        row.append(result.ratio(.gcd, .c).map { fixed($0, 2) } ?? "-")
        row.append(result.ratio(.gcd, .dispatch).map { fixed($0, 2) } ?? "-")
        for variant in Variant.allCases {
          row.append(result.measurements[variant]?.extra("allocs").map { fixed($0, 1) } ?? "-")
        }
        rows.append(row)
      }
      text += alignedTable(rows, leftAligned: 2) + "\n"
      for (reason, names) in unavailableNotes {
        let why = reason.hasPrefix("n/a (") ? String(reason.dropFirst(5).dropLast()) : reason
        text += "n/a = \(why): \(names.joined(separator: ", "))\n"
      }
      let details = extrasLines
      if !details.isEmpty { text += "\n" + details.joined(separator: "\n") + "\n" }
      text += "\nwhat each operation does:\n"
      text += alignedTable(results.map { ["  " + $0.benchmark.name, $0.benchmark.title] }, leftAligned: 2) + "\n"
    }
    if let objectsMissing {
      text += "\nmemory: heap bytes per live object: \(objectsMissing)\n"
    }
    if !objects.isEmpty {
      text += "\nmemory: heap bytes per live object (mallinfo2 growth over \(objectCount) objects, "
      text += "at most 200 for proc/filesystem; the smallest of 3 rounds)\n"
      text += "and the malloc_usable_size of the Swift wrapper object(s) of one object\n"
      var rows = [["object", "C", "GCD", "Dispatch", "GCD - C", "GCD wrapper", "Dispatch wrapper"]]
      for row in objects {
        func heap(_ variant: Variant) -> String { row.heap[variant].map { String(Int($0.rounded())) } ?? "n/a" }
        let added =
          if let gcd = row.heap[.gcd], let c = row.heap[.c] { String(Int((gcd - c).rounded())) } else { "-" }
        rows.append([
          row.kind.name, heap(.c), heap(.gcd), heap(.dispatch), added,
          row.wrapper[.gcd].map { String($0) } ?? "-", row.wrapper[.dispatch].map { String($0) } ?? "n/a",
        ])
      }
      text += alignedTable(rows) + "\n"
    }
    if !rss.isEmpty {
      text += "\npeak RSS growth of a fresh child process (VmHWM, KiB; bytes per item in parentheses)\n"
      var rows = [["workload", "items", "C", "GCD", "Dispatch"]]
      for result in rss {
        var row = [result.workload.rawValue + " (\(result.workload.title))", String(result.count)]
        for variant in Variant.allCases {
          if let growth = result.growth[variant] {
            row.append("\(growth) (\(growth * 1024 / max(result.count, 1)) B)")
          } else {
            row.append(result.unavailable[variant] ?? "-")
          }
        }
        rows.append(row)
      }
      text += alignedTable(rows) + "\n"
    }
    return text
  }

  /// The reasons behind the "n/a" cells, each with its operations and variants.
  var unavailableNotes: [(String, [String])] {
    var notes: [(String, [String])] = []
    for result in results {
      for variant in Variant.allCases {
        guard let reason = result.measurements[variant]?.unavailable, reason.hasPrefix("n/a") else { continue }
        let entry = "\(result.benchmark.name) (\(variant.rawValue))"
        if let index = notes.firstIndex(where: { $0.0 == reason }) {
          notes[index].1.append(entry)
        } else {
          notes.append((reason, [entry]))
        }
      }
    }
    return notes
  }

  /// One line per operation with secondary figures (speed-up, latency spread).
  var extrasLines: [String] {
    results.compactMap { result in
      let shown = result.benchmark.shownExtras
      guard !shown.isEmpty else { return nil }
      let parts = shown.map { extra in
        let values = Variant.allCases.compactMap { variant -> String? in
          guard let value = result.measurements[variant]?.extra(extra.key) else { return nil }
          return "\(variant.rawValue) \(format(value * extra.scale))"
        }
        return "\(extra.label): " + (values.isEmpty ? "-" : values.joined(separator: ", "))
      }
      return "\(result.benchmark.name): " + parts.joined(separator: "; ")
    }
  }

  // MARK: Lines

  var lines: String {
    var out: [String] = []
    for result in results {
      for variant in Variant.allCases {
        guard let measurement = result.measurements[variant] else { continue }
        var line = "op=\(result.benchmark.name) variant=\(variant.rawValue)"
        if let median = measurement.median, let minimum = measurement.minimum {
          line += " ns_per_op=\(fixed(median, 2)) min_ns_per_op=\(fixed(minimum, 2)) runs=\(measurement.samples.count)"
          let keys = Set(measurement.samples.flatMap(\.extras.keys)).sorted()
          for key in keys { line += " \(key)=\(fixed(measurement.extra(key)!, 3))" }
          if variant == .gcd {
            if let ratio = result.ratio(.gcd, .c) { line += " gcd_over_c=\(fixed(ratio, 3))" }
            if let ratio = result.ratio(.gcd, .dispatch) { line += " gcd_over_dispatch=\(fixed(ratio, 3))" }
          }
        } else {
          line += " status=\"\(measurement.unavailable ?? "n/a")\""
        }
        out.append(line)
      }
    }
    for row in objects {
      for variant in Variant.allCases {
        var line = "op=mem_\(row.kind.name) variant=\(variant.rawValue)"
        if let heap = row.heap[variant] {
          line += " bytes_per_object=\(fixed(heap, 1))"
          if let wrapper = row.wrapper[variant] { line += " wrapper_bytes=\(wrapper)" }
        } else {
          line += " status=\"n/a\""
        }
        out.append(line)
      }
    }
    for result in rss {
      for variant in Variant.allCases {
        var line = "op=rss_\(result.workload.rawValue) variant=\(variant.rawValue) items=\(result.count)"
        if let growth = result.growth[variant] {
          line += " peak_rss_growth_kib=\(growth) bytes_per_item=\(growth * 1024 / max(result.count, 1))"
        } else {
          line += " status=\"\(result.unavailable[variant] ?? "n/a")\""
        }
        out.append(line)
      }
    }
    return out.joined(separator: "\n") + "\n"
  }

  // MARK: JSON

  var json: String {
    func string(_ text: String) -> String {
      var escaped = "\""
      for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": escaped += "\\\""
        case "\\": escaped += "\\\\"
        case "\n": escaped += "\\n"
        default:
          if scalar.value < 0x20 {
            escaped += "\\u00" + (scalar.value < 0x10 ? "0" : "") + String(scalar.value, radix: 16)
          } else {
            escaped.unicodeScalars.append(scalar)
          }
        }
      }
      return escaped + "\""
    }
    func number(_ value: Double) -> String { value.isFinite ? fixed(value, 3) : "null" }
    var entries: [String] = []
    for result in results {
      for variant in Variant.allCases {
        guard let measurement = result.measurements[variant] else { continue }
        var fields = [
          "\"op\": \(string(result.benchmark.name))", "\"variant\": \(string(variant.rawValue))",
          "\"unit\": \(string(result.benchmark.unit))",
        ]
        if let median = measurement.median, let minimum = measurement.minimum {
          fields += [
            "\"ns_per_op\": \(number(median))", "\"min_ns_per_op\": \(number(minimum))",
            "\"runs\": \(measurement.samples.count)",
          ]
          let keys = Set(measurement.samples.flatMap(\.extras.keys)).sorted()
          let extras = keys.map { "\(string($0)): \(number(measurement.extra($0)!))" }
          fields.append("\"extras\": {\(extras.joined(separator: ", "))}")
          if variant == .gcd {
            if let ratio = result.ratio(.gcd, .c) { fields.append("\"gcd_over_c\": \(number(ratio))") }
            if let ratio = result.ratio(.gcd, .dispatch) { fields.append("\"gcd_over_dispatch\": \(number(ratio))") }
          }
        } else {
          fields.append("\"status\": \(string(measurement.unavailable ?? "n/a"))")
        }
        entries.append("    {" + fields.joined(separator: ", ") + "}")
      }
    }
    var memory: [String] = []
    for row in objects {
      for variant in Variant.allCases {
        var fields = ["\"object\": \(string(row.kind.name))", "\"variant\": \(string(variant.rawValue))"]
        if let heap = row.heap[variant] {
          fields.append("\"bytes_per_object\": \(number(heap))")
          if let wrapper = row.wrapper[variant] { fields.append("\"wrapper_bytes\": \(wrapper)") }
        } else {
          fields.append("\"status\": \"n/a\"")
        }
        memory.append("    {" + fields.joined(separator: ", ") + "}")
      }
    }
    var peaks: [String] = []
    for result in rss {
      for variant in Variant.allCases {
        var fields = [
          "\"workload\": \(string(result.workload.rawValue))", "\"variant\": \(string(variant.rawValue))",
          "\"items\": \(result.count)",
        ]
        if let growth = result.growth[variant] {
          fields.append("\"peak_rss_growth_kib\": \(growth)")
        } else {
          fields.append("\"status\": \(string(result.unavailable[variant] ?? "n/a"))")
        }
        peaks.append("    {" + fields.joined(separator: ", ") + "}")
      }
    }
    return """
      {
        "machine": \(string(machine.summary)),
        "runs": \(quick ? 1 : repeats),
        "quick": \(quick),
        "results": [
      \(entries.joined(separator: ",\n"))
        ],
        "memory": [
      \(memory.joined(separator: ",\n"))
        ],
        "peak_rss": [
      \(peaks.joined(separator: ",\n"))
        ]
      }

      """
  }

  // MARK: SVG

  /// A horizontal bar chart of GCD/C and GCD/Dispatch per operation, with
  /// the parity line at 1.
  var svg: String {
    let rows = results.filter { $0.ratio(.gcd, .c) != nil || $0.ratio(.gcd, .dispatch) != nil }
    let largest = rows.flatMap { [$0.ratio(.gcd, .c) ?? 0, $0.ratio(.gcd, .dispatch) ?? 0] }.max() ?? 1
    let axisMax = min(4, max(1.5, (largest * 2).rounded(.up) / 2))
    let left = 170.0
    let plotWidth = 560.0
    let rowHeight = 30.0
    let top = 60.0
    let height = top + Double(rows.count) * rowHeight + 50
    let width = left + plotWidth + 90
    func x(_ ratio: Double) -> Double { left + min(ratio, axisMax) / axisMax * plotWidth }
    var svg = """
      <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(width))" height="\(Int(height))" \
      viewBox="0 0 \(Int(width)) \(Int(height))" font-family="sans-serif" font-size="12">
      <rect width="100%" height="100%" fill="white"/>
      <text x="10" y="20" font-size="14" font-weight="bold">GCD time relative to C and to import Dispatch \
      (lower is better; 1 = same time)</text>
      <rect x="\(Int(left))" y="30" width="12" height="10" fill="#3b6fb6"/>
      <text x="\(Int(left) + 16)" y="39">GCD / C</text>
      <rect x="\(Int(left) + 90)" y="30" width="12" height="10" fill="#e08a2c"/>
      <text x="\(Int(left) + 106)" y="39">GCD / Dispatch</text>
      <text x="\(Int(left) + 220)" y="39" fill="#555">\(machine.summary)</text>

      """
    var tick = 0.0
    while tick <= axisMax + 0.001 {
      let position = fixed(x(tick), 1)
      let stroke = abs(tick - 1) < 0.001 ? "stroke=\"#000\" stroke-width=\"1.5\"" : "stroke=\"#ddd\""
      svg += "<line x1=\"\(position)\" y1=\"\(Int(top) - 8)\" x2=\"\(position)\" "
      svg += "y2=\"\(Int(top + Double(rows.count) * rowHeight))\" \(stroke)/>\n"
      svg += "<text x=\"\(position)\" y=\"\(Int(top + Double(rows.count) * rowHeight) + 16)\" "
      svg += "text-anchor=\"middle\">\(fixed(tick, 1))</text>\n"
      tick += 0.5
    }
    for (index, result) in rows.enumerated() {
      let y = top + Double(index) * rowHeight
      svg += "<text x=\"\(Int(left) - 8)\" y=\"\(fixed(y + 16, 1))\" text-anchor=\"end\">"
      svg += "\(result.benchmark.name)</text>\n"
      for (offset, ratio, color) in [
        (3.0, result.ratio(.gcd, .c), "#3b6fb6"), (15.0, result.ratio(.gcd, .dispatch), "#e08a2c"),
      ] {
        guard let ratio else { continue }
        let end = x(ratio)
        svg += "<rect x=\"\(Int(left))\" y=\"\(fixed(y + offset, 1))\" width=\"\(fixed(end - left, 1))\" "
        svg += "height=\"11\" fill=\"\(color)\"/>\n"
        let label = fixed(ratio, 2) + (ratio > axisMax ? " ›" : "")
        svg += "<text x=\"\(fixed(end + 4, 1))\" y=\"\(fixed(y + offset + 10, 1))\" font-size=\"11\">\(label)</text>\n"
      }
    }
    svg += "<text x=\"\(Int(left + plotWidth / 2))\" y=\"\(Int(height) - 12)\" text-anchor=\"middle\" fill=\"#555\">"
    svg += "ratio of medians (bars past \(fixed(axisMax, 1)) are cut)</text>\n</svg>\n"
    return svg
  }
}

/// What the numbers were measured on.
struct Machine {
  let cores: Int
  let cpu: String
  let kernel: String

  static func current() -> Machine {
    var cpu = "unknown CPU"
    if let file = fopen("/proc/cpuinfo", "r") {
      defer { fclose(file) }
      var line = [CChar](repeating: 0, count: 512)
      while fgets(&line, Int32(line.count), file) != nil {
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if text.hasPrefix("model name") {
          cpu = String(text.drop { $0 != ":" }.dropFirst().drop { $0 == " " }.prefix { $0 != "\n" })
          break
        }
      }
    }
    var names = utsname()
    uname(&names)
    let kernel = withUnsafeBytes(of: &names.release) { bytes in
      String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
    }
    return Machine(cores: sysconf(Int32(_SC_NPROCESSORS_ONLN)), cpu: cpu, kernel: kernel)
  }

  var summary: String { "\(cores) cores, \(cpu), Linux \(kernel)" }
}

// MARK: The table in docs/performance.md

/// The operations table of `make bench` as Markdown, between `<!-- bench:begin -->` and
/// `<!-- bench:end -->` in a document (`--doc FILE`). A full run rewrites the block; a run of some
/// operations (`--only`, `--filter`) rewrites their rows alone and adds the ones the block lacks,
/// so the other rows keep what an earlier run measured. Each row says when, at which commit and on
/// which CPU it was measured, since a block can hold rows of several runs.
enum BenchDocument {
  static let begin = "<!-- bench:begin -->"
  static let end = "<!-- bench:end -->"
  static let header =
    "| operation | unit | C | GCD | Dispatch | GCD/C | GCD/Dispatch | allocs C / GCD / Dispatch | measured |"
  static let rule = "|---|---|---:|---:|---:|---:|---:|---|---|"

  /// The block's lines, begin and end markers excluded, or nil (with a note) when `path` cannot be
  /// read or lacks the markers: then nothing may be written.
  static func block(in path: String) -> (lines: [String], begin: Int, end: Int)? {
    guard let contents = readWholeFile(path) else {
      note("GCDBenchmarks: cannot read \(path)")
      return nil
    }
    let lines = contents.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    guard let first = lines.firstIndex(of: begin), let last = lines.firstIndex(of: end), first < last else {
      note("GCDBenchmarks: \(path) has no \(begin) … \(end) block")
      return nil
    }
    return (lines, first, last)
  }

  /// The row of `name` starts with this cell.
  static func key(_ name: String) -> String { "| `\(name)` |" }

  /// `--doc`: writes `report`'s rows into the block of `path`; false (with a note) when it cannot.
  static func write(_ report: Report, to path: String, partial: Bool) -> Bool {
    guard let found = block(in: path) else { return false }
    var lines = found.lines
    let begin = found.begin
    let stamp = "\(todayUTC()), \(commit()), \(report.machine.cpu)"
    let rows = report.results.map { row($0, stamp: stamp) }
    if !partial || !lines[(begin + 1)..<found.end].contains(header) {
      let intro =
        "Written by `make bench` (`GCDBenchmarks --doc`): per variant the median of \(report.repeats) interleaved "
        + "runs, after a warm-up run each, and the heap allocations per operation (the preloaded counter). "
        + (partial
          ? "No full run has written this table yet. "
          : "The last full run: \(todayUTC()) at \(commit()), \(report.machine.summary). ")
        + "A run of some operations (`--only`, `--filter`) rewrites its rows alone; each row says when, at "
        + "which commit (`+`: with uncommitted changes) and on which CPU it was measured."
      lines.replaceSubrange((begin + 1)..<found.end, with: [intro, "", header, rule] + rows)
    } else {
      for (result, text) in zip(report.results, rows) {
        let end = lines.firstIndex(of: Self.end)!
        if let index = lines[(begin + 1)..<end].firstIndex(where: { $0.hasPrefix(key(result.benchmark.name)) }) {
          lines[index] = text
        } else {
          // After the table's last row.
          let last = lines[(begin + 1)..<end].lastIndex { $0.hasPrefix("|") }!
          lines.insert(text, at: last + 1)
        }
      }
    }
    return writeFile(path, lines.joined(separator: "\n"))
  }

  static func row(_ result: BenchmarkResult, stamp: String) -> String {
    var cells = ["`\(result.benchmark.name)`", result.benchmark.unit]
    for variant in Variant.allCases {
      if let median = result.measurements[variant]?.median {
        cells.append(format(median))
      } else {
        let reason = result.measurements[variant]?.unavailable ?? "-"
        cells.append(reason.hasPrefix("n/a") ? "n/a" : "-")
      }
    }
    cells.append(result.ratio(.gcd, .c).map { fixed($0, 2) } ?? "-")
    cells.append(result.ratio(.gcd, .dispatch).map { fixed($0, 2) } ?? "-")
    cells.append(
      Variant.allCases.map { result.measurements[$0]?.extra("allocs").map { fixed($0, 1) } ?? "-" }
        .joined(separator: " / "))
    cells.append(stamp)
    return "| " + cells.joined(separator: " | ") + " |"
  }

  /// The tree's commit, `c70d7ca`, with `+` when tracked files differ from it (read-only git
  /// calls); `?` outside a git work tree.
  static func commit() -> String {
    func run(_ command: String) -> (String, Int32) {
      guard let pipe = popen(command, "r") else { return ("", -1) }
      var output = ""
      var buffer = [CChar](repeating: 0, count: 256)
      while fgets(&buffer, Int32(buffer.count), pipe) != nil {
        output += String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
      }
      return (output.trimmingCharacters(in: "\n"), pclose(pipe))
    }
    let (hash, status) = run("git rev-parse --short HEAD 2>/dev/null")
    guard status == 0, !hash.isEmpty else { return "?" }
    let (_, clean) = run("git diff-index --quiet HEAD -- 2>/dev/null")
    return clean == 0 ? hash : hash + "+"
  }
}

extension String {
  fileprivate func trimmingCharacters(in character: Character) -> String {
    var text = Substring(self)
    while text.last == character { text.removeLast() }
    return String(text)
  }
}
