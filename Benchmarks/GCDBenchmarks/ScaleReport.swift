#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The output of `--scale`: a table per curve with its verdict, the same as
// Markdown for docs/performance.md, and one log-log SVG chart per curve.

/// A count as people write it: 10, 1,000, 100,000.
func grouped(_ value: Int) -> String {
  let digits = String(value)
  var text = ""
  for (index, digit) in digits.enumerated() {
    if index > 0 && (digits.count - index) % 3 == 0 { text += "," }
    text.append(digit)
  }
  return text
}

struct ScaleReport {
  let machine: Machine
  let load: String
  let quick: Bool
  let results: [ScaleResult]

  private func cell(_ result: ScaleResult, _ variant: Variant, _ index: Int) -> String {
    if let value = quick ? result.minimum(variant, index) : result.median(variant, index) { return format(value) }
    if result.row.runners[variant] != nil { return "not run" }
    return result.row.unavailable[variant].map { $0.hasPrefix("n/a") ? "n/a" : $0 } ?? "-"
  }

  private func bytesCell(_ result: ScaleResult, _ variant: Variant, _ index: Int) -> String {
    guard let value = result.bytes[variant]?[index] ?? nil, value.isFinite else { return "-" }
    return String(Int(value.rounded()))
  }

  private func rows(_ result: ScaleResult) -> [[String]] {
    let memory = result.row.runners.values.contains { $0.memory != nil }
    var rows = [["N", "C " + result.row.operation, "GCD", "Dispatch", "GCD/C"]]
    let floor = result.row.floor != nil
    if floor { rows[0].append("tasks floor") }
    if memory { rows[0] += ["C B/object", "GCD B/object", "Dispatch B/object"] }
    for (index, count) in result.counts.enumerated() {
      var row = [grouped(count)] + Variant.allCases.map { cell(result, $0, index) }
      let figure = quick ? result.minimum : result.median
      if let gcd = figure(.gcd, index), let c = figure(.c, index), c > 0 {
        row.append(fixed(gcd / c, 2))
      } else {
        row.append("-")
      }
      if floor { row.append(result.floor(index, quick: quick).map(format) ?? "-") }
      if memory { row += Variant.allCases.map { bytesCell(result, $0, index) } }
      rows.append(row)
    }
    return rows
  }

  private var method: String {
    quick
      ? "--quick: each curve at two small N, the smallest of 5 interleaved rounds (a broken target is measured again, twice at most)"
      : "the median of interleaved rounds per point, after one warm-up run each"
  }

  var table: String {
    var text = "GCDBenchmarks --scale — \(machine.summary)\nload average at the start: \(load)\n\(method)\n"
    for result in results {
      text += "\n\(result.row.name): \(result.row.title)\n"
      text += alignedTable(rows(result), leftAligned: 0) + "\n"
      for (variant, reason) in result.row.unavailable.sorted(by: { $0.key.rawValue < $1.key.rawValue })
      where result.row.runners[variant] == nil {
        text += "  \(variant.rawValue): \(reason)\n"
      }
      if let floor = result.row.floor { text += "  tasks floor: \(floor.title)\n" }
      text += "  target \(result.verdict(quick: quick).text)\n"
    }
    return text
  }

  /// The "Scale" results for docs/performance.md: a table and a chart per curve.
  /// With `perCurve` (a run of some curves, merged into the section), each curve's block says
  /// when and where it was measured; otherwise the section's first line says it for all.
  func markdown(chartFolder: String, perCurve: Bool = false) -> String {
    let measured = "Measured on \(machine.summary); load average at the start: \(load). "
    var text = perCurve ? "" : measured
    text += "Each figure is \(quick ? "the smallest" : "the median") of the interleaved rounds at that N.\n"
    for result in results {
      text += "\n#### \(result.row.name): \(result.row.title)\n\n"
      if perCurve { text += measured + "A run of some curves, \(todayUTC()).\n\n" }
      let table = rows(result)
      text += "| " + table[0].joined(separator: " | ") + " |\n"
      text += "|" + table[0].map { _ in "---:" }.joined(separator: "|") + "|\n"
      for row in table.dropFirst() { text += "| " + row.joined(separator: " | ") + " |\n" }
      for (variant, reason) in result.row.unavailable.sorted(by: { $0.key.rawValue < $1.key.rawValue })
      where result.row.runners[variant] == nil {
        text += "\n\(variant.rawValue): \(reason)."
      }
      if let floor = result.row.floor { text += "\nTasks floor: \(floor.title)." }
      text += "\nTarget \(result.verdict(quick: quick).text).\n\n"
      text += "![\(result.row.name)](\(chartFolder)/\(result.row.name).svg)\n"
    }
    return text
  }

  /// A log-log chart of one curve: N across, ns per operation up, a line each for C, GCD, Dispatch.
  func svg(_ result: ScaleResult) -> String {
    let colors: [Variant: String] = [.c: "#555555", .gcd: "#3b6fb6", .dispatch: "#e08a2c"]
    let figure = quick ? result.minimum : result.median
    var points: [Variant: [(Double, Double)]] = [:]
    for variant in Variant.allCases {
      points[variant] = result.counts.indices.compactMap { index in
        guard let value = figure(variant, index), value > 0 else { return nil }
        return (Double(result.counts[index]), value)
      }
    }
    let floorPoints: [(Double, Double)] = result.counts.indices.compactMap { index in
      guard let value = result.floor(index, quick: quick), value > 0 else { return nil }
      return (Double(result.counts[index]), value)
    }
    let all = points.values.flatMap { $0 } + floorPoints
    guard !all.isEmpty else { return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"/>\n" }
    let xLow = floor(log10(all.map(\.0).min()!))
    let xHigh = max(xLow + 1, ceil(log10(all.map(\.0).max()!)))
    let yLow = floor(log10(all.map(\.1).min()!))
    let yHigh = max(yLow + 1, ceil(log10(all.map(\.1).max()!)))
    let left = 70.0
    let top = 50.0
    let width = 480.0
    let height = 260.0
    func x(_ value: Double) -> Double { left + (log10(value) - xLow) / (xHigh - xLow) * width }
    func y(_ value: Double) -> Double { top + height - (log10(value) - yLow) / (yHigh - yLow) * height }
    var svg = """
      <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(left + width + 130))" height="\(Int(top + height + 60))" \
      font-family="sans-serif" font-size="12">
      <rect width="100%" height="100%" fill="white"/>
      <text x="10" y="20" font-size="14" font-weight="bold">\(result.row.name): \(result.row.operation) \
      against N (log-log)</text>
      <text x="10" y="38" fill="#555">\(machine.summary)</text>

      """
    var decade = xLow
    while decade <= xHigh + 0.001 {
      let position = fixed(x(pow(10, decade)), 1)
      svg +=
        "<line x1=\"\(position)\" y1=\"\(Int(top))\" x2=\"\(position)\" y2=\"\(Int(top + height))\" stroke=\"#ddd\"/>\n"
      svg += "<text x=\"\(position)\" y=\"\(Int(top + height) + 16)\" text-anchor=\"middle\">"
      svg += "\(grouped(Int(pow(10, decade))))</text>\n"
      decade += 1
    }
    decade = yLow
    while decade <= yHigh + 0.001 {
      let position = fixed(y(pow(10, decade)), 1)
      svg +=
        "<line x1=\"\(Int(left))\" y1=\"\(position)\" x2=\"\(Int(left + width))\" y2=\"\(position)\" stroke=\"#ddd\"/>\n"
      svg += "<text x=\"\(Int(left) - 6)\" y=\"\(position)\" text-anchor=\"end\" dominant-baseline=\"middle\">"
      svg += "\(format(pow(10, decade)))</text>\n"
      decade += 1
    }
    svg += "<text x=\"\(Int(left + width / 2))\" y=\"\(Int(top + height) + 36)\" text-anchor=\"middle\" fill=\"#555\">"
    svg += "N (objects live at once)</text>\n"
    for (offset, variant) in Variant.allCases.enumerated() {
      guard let line = points[variant], !line.isEmpty, let color = colors[variant] else { continue }
      let path = line.map { "\(fixed(x($0.0), 1)),\(fixed(y($0.1), 1))" }.joined(separator: " ")
      svg += "<polyline points=\"\(path)\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"/>\n"
      for point in line {
        svg += "<circle cx=\"\(fixed(x(point.0), 1))\" cy=\"\(fixed(y(point.1), 1))\" r=\"3\" fill=\"\(color)\"/>\n"
      }
      let legendY = Int(top) + 10 + offset * 18
      svg +=
        "<rect x=\"\(Int(left + width) + 14)\" y=\"\(legendY - 9)\" width=\"12\" height=\"10\" fill=\"\(color)\"/>\n"
      svg += "<text x=\"\(Int(left + width) + 30)\" y=\"\(legendY)\">\(variant.rawValue)</text>\n"
    }
    if !floorPoints.isEmpty {
      let path = floorPoints.map { "\(fixed(x($0.0), 1)),\(fixed(y($0.1), 1))" }.joined(separator: " ")
      svg +=
        "<polyline points=\"\(path)\" fill=\"none\" stroke=\"#999\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"/>\n"
      let legendY = Int(top) + 10 + 3 * 18
      svg += "<line x1=\"\(Int(left + width) + 14)\" y1=\"\(legendY - 4)\" x2=\"\(Int(left + width) + 26)\" "
      svg += "y2=\"\(legendY - 4)\" stroke=\"#999\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"/>\n"
      svg += "<text x=\"\(Int(left + width) + 30)\" y=\"\(legendY)\">tasks floor</text>\n"
    }
    svg += "</svg>\n"
    return svg
  }
}

/// Writes `text` to `path`; false (with a note) when it cannot.
func writeFile(_ path: String, _ text: String) -> Bool {
  guard let file = fopen(path, "w") else {
    note("GCDBenchmarks: cannot write \(path)")
    return false
  }
  fputs(text, file)
  fclose(file)
  return true
}

/// Replaces, in the file at `path`, the blocks of the curves `text` has (each from its
/// `#### name:` line to the next one or `<!-- scale:end -->`), and adds the ones it lacks before
/// the end marker; the other curves' blocks and the section's first line stay. For a run of some
/// curves (`--only`, `--filter`): the section keeps what the other curves measured.
func replaceScaleRows(in path: String, with text: String) -> Bool {
  guard let contents = readWholeFile(path) else { return false }
  var lines = contents.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
  guard let begin = lines.firstIndex(of: "<!-- scale:begin -->"),
    lines.firstIndex(of: "<!-- scale:end -->").map({ begin < $0 }) == true
  else {
    note("GCDBenchmarks: \(path) has no <!-- scale:begin --> … <!-- scale:end --> section")
    return false
  }
  func blocks(_ lines: [String]) -> [(name: String, lines: [String])] {
    var found: [(name: String, lines: [String])] = []
    for line in lines {
      if line.hasPrefix("#### "), let colon = line.firstIndex(of: ":") {
        found.append((String(line[line.index(line.startIndex, offsetBy: 5)..<colon]), [line]))
      } else if !found.isEmpty {
        found[found.count - 1].lines.append(line)
      }
    }
    return found
  }
  for block in blocks(text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)) {
    let end = lines.firstIndex(of: "<!-- scale:end -->")!
    let start = lines[begin..<end].firstIndex { $0.hasPrefix("#### \(block.name):") }
    var replacement = block.lines
    while replacement.last == "" { replacement.removeLast() }
    replacement.append("")
    if let start {
      let stop = lines[(start + 1)..<end].firstIndex { $0.hasPrefix("#### ") } ?? end
      lines.replaceSubrange(start..<stop, with: replacement)
    } else {
      lines.insert(contentsOf: replacement, at: end)
    }
  }
  return writeFile(path, lines.joined(separator: "\n"))
}

/// The whole file at `path`; nil when it cannot be read.
func readWholeFile(_ path: String) -> String? {
  guard let file = fopen(path, "r") else { return nil }
  var contents = ""
  var buffer = [CChar](repeating: 0, count: 4096)
  while fgets(&buffer, Int32(buffer.count), file) != nil {
    contents += String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }
  fclose(file)
  return contents
}

/// Replaces what lies between `<!-- scale:begin -->` and `<!-- scale:end -->` in the file at `path`.
func replaceScaleSection(in path: String, with text: String) -> Bool {
  guard var contents = readWholeFile(path) else { return false }
  let lines = contents.split(separator: "\n", omittingEmptySubsequences: false)
  guard let begin = lines.firstIndex(of: "<!-- scale:begin -->"),
    let end = lines.firstIndex(of: "<!-- scale:end -->"), begin < end
  else {
    note("GCDBenchmarks: \(path) has no <!-- scale:begin --> … <!-- scale:end --> section")
    return false
  }
  contents = (lines[...begin] + [Substring(text)] + lines[end...]).joined(separator: "\n")
  return writeFile(path, contents)
}

/// `--scale`: runs the curves, prints the table, writes the charts and the
/// doc section when asked; exits 1 in `--quick` when a target breaks.
func runScale(
  library: CLibrary?, variants: [Variant], quick: Bool, selected: (String) -> Bool, chartFolder: String?,
  document: String?, partial: Bool
) -> Never {
  let rows = scaleRows(library, sockets: ScaleSockets(pairs: 0)).filter { selected($0.name) }
  // The socket rows (idle_read, read_churn, connection_churn) take their idle sockets from here.
  let largest =
    rows.filter { $0.name.contains("read") || $0.name.contains("connection") }.flatMap {
      quick ? $0.quickCounts : $0.counts
    }.max() ?? 0
  let limits = RaisedLimits(files: 2 * largest + 4_096, watches: 2 * largest + 8_192)
  let sockets = ScaleSockets(pairs: largest)
  if let setFileDescriptors = library?.symbol(
    "bench_c_scale_set_fds", as: (@convention(c) (UnsafeMutablePointer<Int32>, Int64) -> Void).self)
  {
    setFileDescriptors(sockets.fds, Int64(sockets.pairs))
  }
  let load = loadAverage()
  var results: [ScaleResult] = []
  for row in scaleRows(library, sockets: sockets) where selected(row.name) {
    note("running scale \(row.name)")
    var result = measureScale(row, variants: variants, quick: quick, heapInUse: library?.heapInUse)
    // --quick: a broken target is measured again, twice at most; a real
    // superlinear step breaks every time, a burst of load does not.
    var attempt = 1
    while quick && !result.verdict(quick: true).holds && attempt < 3 {
      note("  \(row.name): \(result.verdict(quick: true).text); measuring again")
      result = measureScale(row, variants: variants, quick: quick, heapInUse: library?.heapInUse)
      attempt += 1
    }
    results.append(result)
  }
  withExtendedLifetime(sockets) {}
  limits.restore()
  let report = ScaleReport(machine: .current(), load: load, quick: quick, results: results)
  print(report.table, terminator: "")
  if let chartFolder {
    mkdir(chartFolder, 0o755)
    for result in results where writeFile("\(chartFolder)/\(result.row.name).svg", report.svg(result)) {
      note("wrote \(chartFolder)/\(result.row.name).svg")
    }
  }
  if let document {
    let relative = chartFolder.map { folder in
      folder.hasPrefix("docs/") ? String(folder.dropFirst("docs/".count)) : folder
    }
    let markdown = report.markdown(chartFolder: relative ?? ".", perCurve: partial)
    if partial {
      if replaceScaleRows(in: document, with: markdown) {
        note("wrote \(results.map(\.row.name).joined(separator: ", ")) in the scale section of \(document)")
      }
    } else if replaceScaleSection(in: document, with: markdown) {
      note("wrote the scale section of \(document)")
    }
  }
  let broken = results.filter { !$0.verdict(quick: quick).holds }
  if quick && !broken.isEmpty {
    note("GCDBenchmarks --scale --quick: target broken: \(broken.map(\.row.name).joined(separator: ", "))")
    exit(1)
  }
  exit(0)
}

/// Today's date (UTC), `2026-12-05`.
func todayUTC() -> String {
  var now = time(nil)
  var parts = tm()
  gmtime_r(&now, &parts)
  func padded(_ value: Int32, _ width: Int) -> String {
    let digits = String(value)
    return String(repeating: "0", count: max(0, width - digits.count)) + digits
  }
  return "\(padded(parts.tm_year + 1900, 4))-\(padded(parts.tm_mon + 1, 2))-\(padded(parts.tm_mday, 2))"
}
