-- The command line of `:AgentBash`, read as `:!` reads its own (contract §8.4): `%` and `#` (with
-- modifiers such as `:p`, `:h`, `:t:r`) standing as a word, and `<cword>`, `<cWORD>`, `<cfile>`,
-- `<cexpr>` anywhere, become what |expand()| gives; `\%`, `\#` and `\<` keep the character.
-- Everything else stays byte for byte (no |expandcmd()|: it would eat backslashes, and
-- `printf 'a\nb\n'` must reach the shell intact). The last command is kept for `:AgentBash`
-- with no argument (`:!!`).

local M = {}
local H = {}

--- Expands the special words of a command line. Returns the command, or nil and a message
--- (a `%` with no file name, no word under the cursor).
---@param line string
---@return string? cmd
---@return string? err
function M.expand(line)
  local out = {}
  local i, n = 1, #line
  while i <= n do
    local c = line:sub(i, i)
    local nxt = line:sub(i + 1, i + 1)
    if c == '\\' and (nxt == '%' or nxt == '#' or nxt == '<') then
      out[#out + 1] = nxt
      i = i + 2
    elseif (c == '%' or c == '#') and H.word_start(line, i) then
      local j = i + 1
      if c == '#' then
        j = (line:find('[^%d]', j) or n + 1)
      end
      local mods_end = H.modifiers(line, j)
      if H.word_end(line, mods_end) then
        local word = line:sub(i, mods_end - 1)
        local value = vim.fn.expand(word)
        if value == '' then
          return nil, c == '%' and ("no file name to substitute for '%' (the buffer has no name)")
            or ("no alternate file name to substitute for '#'")
        end
        out[#out + 1] = value
        i = mods_end
      else
        out[#out + 1] = c
        i = i + 1
      end
    elseif c == '<' then
      local word = H.special(line, i)
      if word then
        local mods_end = H.modifiers(line, i + #word)
        local value = vim.fn.expand(line:sub(i, mods_end - 1))
        if value == '' then
          return nil, ('nothing under the cursor to substitute for %s'):format(word)
        end
        out[#out + 1] = value
        i = mods_end
      else
        out[#out + 1] = c
        i = i + 1
      end
    else
      -- copy a run of ordinary bytes at once
      local j = line:find('[\\%%#<]', i + 1) or n + 1
      out[#out + 1] = line:sub(i, j - 1)
      i = j
    end
  end
  return table.concat(out)
end

--- Remembers the command run last (for `:AgentBash` with no argument).
---@param cmd string
function M.remember(cmd)
  H.last = cmd
end

--- The command run last, or nil and a message.
---@return string? cmd
---@return string? err
function M.last()
  if not H.last then
    return nil, 'no previous command to run again (:AgentBash {cmd} runs one)'
  end
  return H.last
end

-- Helpers -----------------------------------------------------------------------------------

H.last = nil ---@type string?
H.specials = { '<cword>', '<cWORD>', '<cfile>', '<cexpr>' }

--- `%`/`#` at byte `i` starts a word: the line's start, a space, or a quote/`=`/`(` before it.
function H.word_start(line, i)
  if i == 1 then
    return true
  end
  return line:sub(i - 1, i - 1):match('[%s=("\']') ~= nil
end

--- The word ends at byte `j`: the line's end, a space, a quote or a shell operator.
function H.word_end(line, j)
  if j > #line then
    return true
  end
  return line:sub(j, j):match('[%s"\'();|&<>]') ~= nil
end

--- The byte after the filename modifiers (`:p`, `:h`, `:t`, `:r`, `:e`, `:~`, `:.`, `:8`,
--- `:S`) starting at byte `j`.
function H.modifiers(line, j)
  while line:sub(j, j) == ':' and line:sub(j + 1, j + 1):match('[phtre~.8S]') do
    j = j + 2
  end
  return j
end

--- The special word (`<cword>` …) starting at byte `i`, if any.
function H.special(line, i)
  for _, w in ipairs(H.specials) do
    if line:sub(i, i + #w - 1) == w then
      return w
    end
  end
end

return M
