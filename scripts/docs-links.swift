// Checks the built DocC site's links without a browser (CI runs this; docs/site.md).
//
//   swift scripts/docs-links.swift <site> <Examples folder> [<pages file>]
//
// Reads every page of render JSON under <site>/data and fails when
//   - a page it references (a Topics entry, a symbol link, an article link, a "see also") has no
//     render JSON (data/…/name.json) or no HTML page (…/name/index.html) in the site; the same
//     for a tutorial's sections (references of type "section");
//   - a link with an anchor (`…/buildalinuxservice#Do-the-work-on-a-timer`) names an anchor its
//     page does not have (a heading, a Topics group, a tutorial section);
//   - a tutorial page names a chapter that is not on its table of contents: DocC writes no page for
//     a chapter (its reference, `/tutorials/gcd/a-linux-service`, is a path under the table of
//     contents, and the renderer shows it as text, linking chapters only as anchors of the table of
//     contents, `/tutorials/gcd/#a-linux-service`), so a chapter reference resolves when its table of
//     contents exists and lists a chapter of that name, and not otherwise;
//   - a relative link points at no file of the site;
//   - its text names an example that does not exist: `swift run Example<Name>` or
//     `Examples/<Name>/main.swift` without an Examples/<Name>/main.swift;
//   - the landing page reaches no article or no symbol page.
// With a third argument it writes there every page reachable from the landing page through Topics
// groups (landing page, articles, tutorials, symbol pages), one a line as its path, a tab and its
// title, for scripts/docs-check.sh to open in a browser. Only the Swift toolchain is needed.
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 3 || arguments.count == 4 else {
  FileHandle.standardError.write(
    "usage: swift scripts/docs-links.swift <site> <Examples folder> [<pages file>]\n".data(using: .utf8)!)
  exit(2)
}
let site = arguments[1]
let examples = arguments[2]
let files = FileManager.default
var problems: [String] = []

func exists(_ path: String) -> Bool { files.fileExists(atPath: site + "/" + path) }

// Every render JSON page, by its site path ("documentation/gcd/queue").
var pages: [String: [String: Any]] = [:]
let enumerator = files.enumerator(atPath: site + "/data")
while let path = enumerator?.nextObject() as? String {
  guard path.hasSuffix(".json"), let data = files.contents(atPath: site + "/data/" + path),
    let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
  else { continue }
  pages[String(path.dropLast(".json".count))] = object
}
guard !pages.isEmpty else {
  FileHandle.standardError.write("docs-links: no render JSON under \(site)/data: run make docs\n".data(using: .utf8)!)
  exit(1)
}

/// The site path of a reference URL ("/documentation/gcd/queue#Overview" -> "documentation/gcd/queue").
func sitePath(_ url: String) -> String {
  var path = url
  if let hash = path.firstIndex(of: "#") { path = String(path[..<hash]) }
  return String(path.drop(while: { $0 == "/" })).lowercased()
}

/// The anchor a heading or a chapter name gets ("A Linux service" -> "a-linux-service"), lowercased.
func slug(_ name: String) -> String {
  name.lowercased().split(whereSeparator: { !($0.isLetter || $0.isNumber) }).joined(separator: "-")
}

/// Every value of an "anchor" key in a JSON value (headings, Topics groups, tutorial sections).
func anchors(in value: Any, into result: inout Set<String>) {
  switch value {
  case let array as [Any]: for element in array { anchors(in: element, into: &result) }
  case let object as [String: Any]:
    for (key, element) in object {
      if key == "anchor", let anchor = element as? String { result.insert(anchor) }
      anchors(in: element, into: &result)
    }
  default: break
  }
}

/// The anchors of a page: for a tutorials table of contents, its chapters, which the renderer
/// anchors by name (DocC writes no "anchor" for them); for any page, its "anchor" values.
func pageAnchors(_ page: String) -> Set<String> {
  guard let object = pages[page] else { return [] }
  var result = Set<String>()
  anchors(in: object, into: &result)
  for case let section as [String: Any] in object["sections"] as? [Any] ?? [] where section["kind"] as? String == "volume" {
    for case let chapter as [String: Any] in section["chapters"] as? [Any] ?? [] {
      if let name = chapter["name"] as? String { result.insert(slug(name)) }
    }
  }
  return result
}

/// The fragment of a reference URL ("/tutorials/gcd/x#Step" -> "Step"), or nil.
func fragment(_ url: String) -> String? {
  guard let hash = url.firstIndex(of: "#") else { return nil }
  let anchor = String(url[url.index(after: hash)...])
  return anchor.isEmpty ? nil : anchor
}

/// Every string in a JSON value.
func strings(in value: Any, into result: inout [String]) {
  switch value {
  case let string as String: result.append(string)
  case let array as [Any]: for element in array { strings(in: element, into: &result) }
  case let object as [String: Any]: for element in object.values { strings(in: element, into: &result) }
  default: break
  }
}

let examplePattern = try! NSRegularExpression(
  pattern: #"(?:swift run Example([A-Za-z0-9_]+)|Examples/([A-Za-z0-9_]+)/main\.swift)"#)
var checkedReferences = 0
var namedExamples = Set<String>()
for (page, object) in pages.sorted(by: { $0.key < $1.key }) {
  for case let reference as [String: Any] in (object["references"] as? [String: Any] ?? [:]).values {
    guard let url = reference["url"] as? String else { continue }
    switch reference["type"] as? String {
    case "topic", "section":  // "section": a tutorial's section, a page and an anchor
      checkedReferences += 1
      let target = sitePath(url)
      // A tutorial chapter has no page of its own: it is a path under its table of contents, and
      // the renderer links it only as an anchor there ("/tutorials/gcd/#a-linux-service").
      let parent = target.split(separator: "/").dropLast().joined(separator: "/")
      if pages[target] == nil, target.hasPrefix("tutorials/"), reference["kind"] as? String == "article",
        pages[parent]?["kind"] as? String == "overview"
      {
        let chapter = String(target.split(separator: "/").last ?? "")
        if !pageAnchors(parent).contains(chapter) {
          problems.append(
            "\(page): links to \(url), a tutorial chapter that the table of contents /\(parent) does not list "
              + "(its chapters: \(pageAnchors(parent).sorted().joined(separator: ", ")))")
        }
        if !exists(parent + "/index.html") { problems.append("\(page): links to \(url), whose table of contents has no HTML page") }
        continue
      }
      if pages[target] == nil { problems.append("\(page): links to \(url), which has no render JSON") }
      if !exists(target + "/index.html") { problems.append("\(page): links to \(url), which has no HTML page") }
      if let anchor = fragment(url), pages[target] != nil, !pageAnchors(target).contains(anchor) {
        problems.append("\(page): links to \(url), but /\(target) has no anchor \(anchor)")
      }
    case "link":
      checkedReferences += 1
      if url.contains("://") || url.hasPrefix("mailto:") { continue }  // external: not checked offline
      let target = url.hasPrefix("/") ? sitePath(url) : page + "/../" + sitePath(url)
      if !exists(target) && !exists(target + "/index.html") {
        problems.append("\(page): relative link \(url) points at no file of the site")
      }
    default: break
    }
  }
  var texts: [String] = []
  strings(in: object["primaryContentSections"] ?? [], into: &texts)
  strings(in: object["abstract"] ?? [], into: &texts)
  strings(in: object["sections"] ?? [], into: &texts)
  for text in texts {
    for match in examplePattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
      for group in 1...2 {
        guard let range = Range(match.range(at: group), in: text) else { continue }
        let name = String(text[range])
        namedExamples.insert(name)
        if !files.fileExists(atPath: "\(examples)/\(name)/main.swift") {
          problems.append("\(page): names Example\(name), but there is no \(examples)/\(name)/main.swift")
        }
      }
    }
  }
}

// The pages a reader reaches from the landing page through Topics (and tutorial tables of contents).
guard let landing = pages.keys.filter({ $0.hasPrefix("documentation/") && $0.split(separator: "/").count == 2 }).first
else {
  FileHandle.standardError.write("docs-links: no landing page under \(site)/data/documentation\n".data(using: .utf8)!)
  exit(1)
}
var reachable: [String] = []
var seen = Set<String>()
var pending = [landing] + pages.keys.filter { $0.hasPrefix("tutorials/") && $0.split(separator: "/").count == 2 }
while let page = pending.first {
  pending.removeFirst()
  guard seen.insert(page).inserted, let object = pages[page] else { continue }
  reachable.append(page)
  let references = object["references"] as? [String: Any] ?? [:]
  var identifiers: [String] = []
  for section in object["topicSections"] as? [[String: Any]] ?? [] {
    identifiers += section["identifiers"] as? [String] ?? []
  }
  if page.hasPrefix("tutorials/") {  // a tutorial's chapters and steps are references of its pages
    identifiers += references.keys.filter { $0.contains("/tutorials/") }
  }
  for identifier in identifiers {
    guard let reference = references[identifier] as? [String: Any], reference["type"] as? String == "topic",
      let url = reference["url"] as? String
    else { continue }
    pending.append(sitePath(url))
  }
}
let kinds = reachable.compactMap { pages[$0]?["kind"] as? String }
if !kinds.contains("article") { problems.append("the landing page reaches no article through its Topics") }
if !kinds.contains("symbol") || kinds.filter({ $0 == "symbol" }).count < 2 {
  problems.append("the landing page reaches no symbol page through its Topics")
}

if arguments.count == 4 {
  let lines = reachable.map { page -> String in
    let metadata = pages[page]?["metadata"] as? [String: Any]
    return page + "\t" + (metadata?["title"] as? String ?? "")
  }
  try! (lines.joined(separator: "\n") + "\n").write(toFile: arguments[3], atomically: true, encoding: .utf8)
}
if !problems.isEmpty {
  for problem in problems { FileHandle.standardError.write("docs-links: \(problem)\n".data(using: .utf8)!) }
  exit(1)
}
print(
  "docs-links: \(pages.count) pages, \(checkedReferences) links resolve, \(namedExamples.count) examples named exist; "
    + "\(reachable.count) pages reachable from the landing page")
